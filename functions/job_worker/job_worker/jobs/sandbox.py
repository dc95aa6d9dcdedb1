"""The test sandbox as the worker sees it: a checkout packed as a .tar.gz, one synchronous invoke of the sandbox
function per run, and its answer mapped onto the job's outcome.

The worker never runs a test command itself: the sandbox function (template.yaml's TestSandboxFunction) holds no
permission but its own logs and none of the worker's settings, and is invoked per tenant (PER_TENANT isolation), so
agent-written code never shares an execution environment with the worker or with another tenant.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import math
import posixpath
import tarfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal

from botocore.exceptions import BotoCoreError, ClientError

from agent_jobs.settings import SANDBOX_HEADROOM_SECONDS
from job_worker.jobs.errors import PermanentJobError, RetryableJobError

if TYPE_CHECKING:
    from agent_jobs.payloads import PayloadStore
    from agent_jobs.services import LambdaInvoker, Services

# A synchronous invoke carries at most 6 MB of request; base64 grows the archive by a third, and the event's other
# fields are small. Larger checkouts go through the payload bucket and a presigned URL.
INLINE_ARCHIVE_LIMIT_BYTES: Final = 3 * 1024 * 1024
SANDBOX_PREFIX: Final = "sandbox/"
OUTPUT_LIMIT_BYTES: Final = 64 * 1024
# A presigned URL outlives the invocation that reads it by this much.
URL_SLACK_SECONDS: Final = 60
EVENT_VERSION: Final = 1

TestOutcome = Literal["passed", "failed", "timed_out"]
_OUTCOMES: Final = frozenset({"passed", "failed", "timed_out"})


@dataclass(frozen=True)
class SandboxRun:
    """How a test command ended in the sandbox: the fields run_tests stores as the job's result. `limit_reached`:
    the sandbox's word on a limit the tests filled (its /tmp), None when they filled none."""

    outcome: TestOutcome
    exit_code: int | None
    duration_seconds: float
    output_tail: str
    truncated: bool
    limit_reached: str | None = None


def test_timeout_seconds(remaining_ms: int, safety_margin_ms: int, ceiling_seconds: float) -> float:
    """How long the tests may run: the invocation's remaining time less the safety margin, at most `ceiling_seconds`.

    0 means there is no time left to run them in this invocation; the caller should retry the job instead.
    """
    return max(0.0, min(float(ceiling_seconds), (remaining_ms - safety_margin_ms) / 1000))


test_timeout_seconds.__test__ = False  # type: ignore[attr-defined]  # a function of the product, not a pytest test


def pack_checkout(folder: Path) -> bytes:
    """The checkout in `folder` as a .tar.gz: files with their executable bits, folders, and symlinks that stay in the
    tree (a link out of it, absolute or climbing, is left out: the sandbox refuses one, and a test has nothing to
    find outside its checkout). Owners are not recorded."""

    def normalized(member: tarfile.TarInfo) -> tarfile.TarInfo | None:
        if member.issym():
            target = posixpath.normpath(posixpath.join(posixpath.dirname(member.name), member.linkname))
            if member.linkname.startswith("/") or target == ".." or target.startswith("../"):
                return None
        member.uid = member.gid = 0
        member.uname = member.gname = ""
        return member

    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for entry in sorted(folder.iterdir()):
            archive.add(entry, arcname=entry.name, recursive=True, filter=normalized)
    return buffer.getvalue()


@dataclass(frozen=True)
class TestSandbox:
    """The sandbox function, invoked synchronously with the job's tenant as the tenant id."""

    __test__ = False  # a product class, not a pytest test class

    function_name: str
    timeout_seconds: int
    client: Callable[[], LambdaInvoker]
    payloads: PayloadStore
    inline_limit_bytes: int = INLINE_ARCHIVE_LIMIT_BYTES

    @classmethod
    def from_services(cls, services: Services) -> TestSandbox | None:
        """The configured sandbox (TEST_SANDBOX_FUNCTION), or None when there is none."""
        settings = services.settings
        if not settings.test_sandbox_function:
            return None
        return cls(
            function_name=settings.test_sandbox_function,
            timeout_seconds=settings.test_sandbox_timeout_seconds,
            client=services.sandbox_lambda,
            payloads=services.payloads,
        )

    @property
    def longest_run_seconds(self) -> float:
        """The longest test run one invocation allows: its Timeout less what it keeps for unpacking and cleaning up."""
        return float(self.timeout_seconds - SANDBOX_HEADROOM_SECONDS)

    def run(
        self,
        *,
        tenant_id: str,
        workspace_id: str,
        job_id: str,
        commit: str,
        argv: Sequence[str],
        timeout_seconds: float,
        archive: bytes,
    ) -> SandboxRun:
        """Run `argv` on the checkout `archive` of `commit`. Raises PermanentJobError when the sandbox says the
        request can never run, RetryableJobError when the sandbox could not be reached or did not answer."""
        event = {
            "v": EVENT_VERSION,
            "jobId": job_id,
            "workspaceId": workspace_id,
            "tenantId": tenant_id,
            "commit": commit,
            "argv": list(argv),
            "timeoutSeconds": round(timeout_seconds, 3),
            "outputLimitBytes": OUTPUT_LIMIT_BYTES,
            "archive": self._archive(archive, f"{SANDBOX_PREFIX}{tenant_id}/{workspace_id}/{job_id}/{commit}.tar.gz"),
        }
        return self._answer(self._invoke(event, tenant_id))

    def _archive(self, archive: bytes, key: str) -> dict[str, Any]:
        digest = hashlib.sha256(archive).hexdigest()
        if len(archive) <= self.inline_limit_bytes:
            return {"inline": base64.b64encode(archive).decode("ascii"), "sha256": digest}
        if self.payloads.bucket is None:
            raise PermanentJobError(
                f"the checkout is {len(archive)} bytes, more than the {self.inline_limit_bytes} a sandbox invocation"
                " carries inline, and no payload bucket is configured (PAYLOAD_BUCKET) to pass it by URL"
            )
        try:
            self.payloads.client.put_object(
                Bucket=self.payloads.bucket,
                Key=key,
                Body=archive,
                ContentType="application/gzip",
                ServerSideEncryption="AES256",
            )
            url = self.payloads.client.generate_presigned_url(
                "get_object",
                Params={"Bucket": self.payloads.bucket, "Key": key},
                ExpiresIn=math.ceil(self.timeout_seconds) + URL_SLACK_SECONDS,
            )
        except (BotoCoreError, ClientError) as error:
            raise RetryableJobError(f"could not upload the checkout for the test sandbox: {error}") from error
        return {"url": url, "sha256": digest, "size": len(archive)}

    def _invoke(self, event: Mapping[str, Any], tenant_id: str) -> Any:
        try:
            response = self.client().invoke(
                FunctionName=self.function_name,
                InvocationType="RequestResponse",
                TenantId=tenant_id,
                Payload=json.dumps(event).encode(),
            )
            body = response["Payload"].read()
        except (BotoCoreError, ClientError) as error:
            # throttled (429), unreachable, timed out, or no such function: nothing ran to completion, so try again
            raise RetryableJobError(
                f"the test sandbox {self.function_name!r} (TEST_SANDBOX_FUNCTION) could not be invoked: {error}"
            ) from error
        try:
            answer = json.loads(body) if body else None
        except ValueError:
            answer = None
        if response.get("FunctionError"):
            details = answer if isinstance(answer, dict) else {}
            raise RetryableJobError(
                f"the test sandbox failed ({details.get('errorType', response['FunctionError'])}):"
                f" {details.get('errorMessage', 'no message')}"
            )
        return answer

    def _answer(self, answer: Any) -> SandboxRun:
        if isinstance(answer, dict) and isinstance(answer.get("error"), str):
            message = f"the test sandbox could not run the tests: {answer['error']}"
            if answer.get("permanent") is True:
                raise PermanentJobError(message)
            raise RetryableJobError(message)
        try:
            outcome = answer["outcome"]
            exit_code = answer["exitCode"]
            run = SandboxRun(
                outcome=outcome,
                exit_code=None if exit_code is None else int(exit_code),
                duration_seconds=float(answer["durationSeconds"]),
                output_tail=str(answer["outputTail"]),
                truncated=bool(answer["truncated"]),
                limit_reached=str(answer["limitReached"]) if answer.get("limitReached") else None,
            )
        except (KeyError, TypeError, ValueError):
            run = None
        if run is None or outcome not in _OUTCOMES:
            raise RetryableJobError(f"the test sandbox answered with something that is not a test run: {answer!r:.300}")
        return run
