"""run_tests: run a named test command of the workspace on the branch head, reusing a stored result.

The command is one the workspace registered (an argv list), never a string from the job, and it runs in the test
sandbox function, never inside the worker: the checkout of the head is packed and handed to the sandbox, which runs
the command for the job's tenant. Failing tests are a successful job with a failed result; only a run that could not
happen (no time left, no such command, no sandbox) is an error.

A run stopped by the time left in the invocation is a verdict only when it had most of what a whole invocation gives
(at least `CUT_SHORT_SHARE` of it). A run that started late, behind other jobs of its batch, and timed out says
nothing about the suite: the job is retried (the retry leads its message group's next batch), and no result is stored.
"""

from __future__ import annotations

from typing import Any, Final

from agent_jobs.models import RunTestsJob
from job_worker.jobs.context import JobContext
from job_worker.jobs.errors import OutOfTimeError, PermanentJobError
from job_worker.jobs.git_workspace import GitWorkspace
from job_worker.jobs.sandbox import pack_checkout, test_timeout_seconds
from job_worker.jobs.scratch import scratch_folder

# Below this share of a whole invocation's test time, a timed-out run is retried instead of recorded.
CUT_SHORT_SHARE: Final = 0.5


def run(job: RunTestsJob, context: JobContext) -> dict[str, Any]:
    workspace = context.workspace
    head = workspace.head()
    stored = workspace.stored_test_result(job.job_id, head)
    if stored is not None:
        return {**stored, "reused": True}
    suite = job.payload.suite
    if context.registration is None or not isinstance(workspace, GitWorkspace):
        # A folder workspace has no code to test: the suite is recorded against the head it would have run on.
        result: dict[str, Any] = {"suite": suite, "commit": head, "commits": len(workspace.history())}
        result["outcome"] = "recorded"
    else:
        argv = context.registration.registration.test_commands.get(suite)
        if not argv:
            raise PermanentJobError(
                f"workspace {workspace.workspace_id!r} has no test command {suite!r}: add it to testCommands with"
                f" PUT /workspaces/{workspace.workspace_id}"
            )
        sandbox = context.test_sandbox()
        if sandbox is None:
            raise PermanentJobError(
                "no test sandbox is configured: set TEST_SANDBOX_FUNCTION to the test sandbox function"
                " (template.yaml's TestSandboxFunction); tests never run inside the worker"
            )
        timeout = test_timeout_seconds(context.remaining_ms(), context.safety_margin_ms, sandbox.longest_run_seconds)
        whole = test_timeout_seconds(context.invocation_ms, context.safety_margin_ms, sandbox.longest_run_seconds)
        if timeout <= 0:
            raise OutOfTimeError("not enough time left in this invocation to run the tests")
        # Removed when the job ends, and by the next job if this process is killed first.
        with scratch_folder() as folder:
            workspace.checkout(head, folder)
            archive = pack_checkout(folder)
        outcome = sandbox.run(
            tenant_id=context.registration.tenant_id,
            workspace_id=workspace.workspace_id,
            job_id=job.job_id,
            commit=head,
            argv=argv,
            timeout_seconds=timeout,
            archive=archive,
        )
        if outcome.outcome == "timed_out" and timeout < CUT_SHORT_SHARE * whole:
            raise OutOfTimeError(
                f"the tests were stopped after {timeout:.1f} s, the time left in this invocation, before they finished;"
                f" a whole invocation gives them {whole:.1f} s: they run again at the head of the next batch"
            )
        result = {
            "suite": suite,
            "commit": head,
            "outcome": outcome.outcome,
            "exitCode": outcome.exit_code,
            "durationSeconds": round(outcome.duration_seconds, 3),
            "outputTail": outcome.output_tail,
            "truncated": outcome.truncated,
        }
        if outcome.limit_reached is not None:
            result["limitReached"] = outcome.limit_reached
    workspace.store_test_result(job.job_id, head, result)
    return {**result, "reused": False}
