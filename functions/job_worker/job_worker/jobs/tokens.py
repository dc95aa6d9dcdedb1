"""Tokens for HTTPS git remotes and GitHub, read from SSM Parameter Store or Secrets Manager (Powertools Parameters,
cached for five minutes, so a rotated token is picked up without a redeploy)."""

from __future__ import annotations

from aws_lambda_powertools.utilities import parameters

from job_worker.jobs.errors import PermanentJobError, RetryableJobError

TOKEN_CACHE_SECONDS = 300


def read_token(reference: str) -> str:
    """`reference` is "ssm:<parameter name>" or "secretsmanager:<secret id or ARN>" (as registered)."""
    kind, _, name = reference.partition(":")
    try:
        if kind == "ssm":
            return str(parameters.get_parameter(name, decrypt=True, max_age=TOKEN_CACHE_SECONDS))
        if kind == "secretsmanager":
            return str(parameters.get_secret(name, max_age=TOKEN_CACHE_SECONDS))
    except parameters.exceptions.GetParameterError as error:
        # Throttling and outages are transient; a missing or forbidden parameter fails every attempt and ends DEAD.
        raise RetryableJobError(f"could not read the workspace token {reference!r}: {error}") from error
    raise PermanentJobError(f"token reference {reference!r} must start with 'ssm:' or 'secretsmanager:'")
