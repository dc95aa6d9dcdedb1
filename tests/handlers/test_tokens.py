"""Workspace tokens through Powertools Parameters, against moto's SSM and Secrets Manager."""

from __future__ import annotations

from collections.abc import Iterator

import boto3
import pytest
from aws_lambda_powertools.utilities import parameters
from moto import mock_aws

from job_worker.jobs.errors import PermanentJobError, RetryableJobError
from job_worker.jobs.tokens import read_token


@pytest.fixture(autouse=True)
def aws() -> Iterator[None]:
    with mock_aws():
        parameters.clear_caches()  # type: ignore[no-untyped-call]
        yield
    parameters.clear_caches()  # type: ignore[no-untyped-call]


def test_read_token_from_an_ssm_secure_string():
    boto3.client("ssm").put_parameter(Name="/agent-jobs/github", Value="ghp_example", Type="SecureString")
    assert read_token("ssm:/agent-jobs/github") == "ghp_example"


def test_read_token_from_secrets_manager():
    boto3.client("secretsmanager").create_secret(Name="agent-jobs/gitlab", SecretString="glpat-example")
    assert read_token("secretsmanager:agent-jobs/gitlab") == "glpat-example"


def test_read_token_is_cached_until_it_expires():
    ssm = boto3.client("ssm")
    ssm.put_parameter(Name="/agent-jobs/t", Value="one", Type="SecureString")
    assert read_token("ssm:/agent-jobs/t") == "one"
    ssm.put_parameter(Name="/agent-jobs/t", Value="two", Type="SecureString", Overwrite=True)
    assert read_token("ssm:/agent-jobs/t") == "one"  # five minutes of cache: rotation is seen at the next refresh


def test_read_token_missing_parameter_is_retryable_and_named():
    with pytest.raises(RetryableJobError, match="ssm:/agent-jobs/missing"):
        read_token("ssm:/agent-jobs/missing")


def test_read_token_unknown_store_is_permanent():
    with pytest.raises(PermanentJobError, match="must start with 'ssm:' or 'secretsmanager:'"):
        read_token("vault:secret/x")
