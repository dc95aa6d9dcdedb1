"""Jobs checked at submit against their workspace's registration and a patch that is no diff (`POST /jobs` and
`POST /jobs:batch`): refused with a 422 that names the fix instead of accepted to halt the workspace, through the
Lambda handler against the table and queue of template.yaml in moto (in-process and moto's server)."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from agent_jobs.registration import WorkspaceRegistration
from agent_jobs.workspaces import WorkspaceRegistry
from enqueue_api import app
from tests.conftest import Stack
from tests.integration.test_batch_enqueue import batch_event
from tests.integration.test_enqueue_api import PATCH, Api, job_body

TENANT = "tenant-demo"  # the tenant of the sample events' token
SUITES = {"unit": ["python", "-m", "pytest"], "lint": ["ruff", "check", "."]}


def register(stack: Stack, workspace_id: str = "w1", **fields: Any) -> None:
    """Register `workspace_id` as another process of the API would (this one keeps nothing of it)."""
    registration = WorkspaceRegistration.model_validate(
        {
            "remoteUrl": f"https://git.example.com/{TENANT}/{workspace_id}.git",
            "branch": f"agent/{workspace_id}",
            **fields,
        }
    )
    WorkspaceRegistry(stack.services.dynamodb, stack.table_name).register(workspace_id, registration, TENANT)


def run_tests(job_id: str, suite: str | None = None, workspace_id: str = "w1") -> dict[str, Any]:
    payload = {} if suite is None else {"suite": suite}
    return job_body(job_id, workspace_id, type="run_tests", payload=payload)


def open_pr(job_id: str, workspace_id: str = "w1") -> dict[str, Any]:
    return job_body(job_id, workspace_id, type="open_pr", payload={"title": "agent changes"})


def apply_patch(job_id: str, patch: str, workspace_id: str = "w1") -> dict[str, Any]:
    return job_body(job_id, workspace_id, payload={"patch": patch, "commitMessage": f"change for {job_id}"})


def nothing_accepted(api: Api) -> bool:
    return api.stack.queue_depth() == 0 and not [item for item in api.items() if item["pk"]["S"].startswith("job#")]


# ---- a single job ---------------------------------------------------------------------------------------------------


def test_run_tests_naming_a_suite_the_registration_lacks_is_422_naming_its_suites(api: Api) -> None:
    register(api.stack, testCommands=SUITES)

    response = api.post(run_tests("t1"))  # the suite left out is "default"

    expected = (
        "workspace w1 has no test suite 'default'; its suites are: lint, unit; name one of them, or add the suite with "
        "PUT /workspaces/w1"
    )
    assert response.status == 422
    assert response.body["message"] == expected
    assert response.field_errors() == {"payload.suite": expected}
    assert nothing_accepted(api)


def test_run_tests_on_a_workspace_without_suites_is_422_saying_to_add_one(api: Api) -> None:
    register(api.stack)

    response = api.post(run_tests("t1", "unit"))

    assert response.status == 422
    assert response.field_errors() == {
        "payload.suite": "workspace w1 has no test suites; add the suite 'unit' to its testCommands with "
        "PUT /workspaces/w1"
    }
    assert nothing_accepted(api)


def test_open_pr_on_a_workspace_without_a_github_repository_is_422(api: Api) -> None:
    register(api.stack, testCommands=SUITES)

    response = api.post(open_pr("pr1"))

    assert response.status == 422
    assert response.field_errors() == {
        "workspaceId": "workspace w1 has no githubRepository, which an open_pr job opens its pull request on; add it "
        "(owner/repository) with PUT /workspaces/w1"
    }
    assert nothing_accepted(api)


@pytest.mark.parametrize(
    "patch",
    [
        "make the README say hello",
        "--- a/README.md\n+++ b/README.md\n",  # file headers, no hunk
        "@@ -1 +1 @@\n-old\n+new\n",  # a hunk, no file header
        "+++ b/README.md\n--- a/README.md\n@@ -1 +1 @@\n-old\n+new\n",  # headers the wrong way round
    ],
    ids=["prose", "no-hunk", "no-file-header", "headers-reversed"],
)
def test_apply_patch_that_is_not_a_diff_is_422_on_the_patch(api: Api, patch: str) -> None:
    register(api.stack)

    response = api.post(apply_patch("p1", patch))

    assert response.status == 422
    assert "the patch is not a diff" in response.field_errors()["payload.patch"]
    assert "send what git diff (or diff -u) prints" in response.field_errors()["payload.patch"]
    assert nothing_accepted(api)


@pytest.mark.parametrize(
    "patch",
    [
        PATCH,
        PATCH.replace("\n", "\r\n"),
        "diff --git a/old.txt b/new.txt\nsimilarity index 100%\nrename from old.txt\nrename to new.txt\n",
        "diff --git a/run.sh b/run.sh\nold mode 100644\nnew mode 100755\n",
    ],
    ids=["unified", "crlf", "rename-only", "mode-only"],
)
def test_apply_patch_that_is_a_diff_is_accepted_with_or_without_hunks(api: Api, patch: str) -> None:
    register(api.stack)

    assert api.post(apply_patch("p1", patch)).status == 202


def test_jobs_that_fit_their_registration_are_accepted(api: Api) -> None:
    register(api.stack, testCommands={**SUITES, "default": ["make", "test"]}, githubRepository="acme/w1")

    assert api.post(run_tests("t1")).status == 202
    assert api.post(run_tests("t2", "lint")).status == 202
    assert api.post(open_pr("pr1")).status == 202


# ---- a batch ----------------------------------------------------------------------------------------------------


def test_batch_with_jobs_that_do_not_fit_is_422_naming_each_and_accepts_nothing(api: Api) -> None:
    register(api.stack, testCommands=SUITES)
    jobs = [run_tests("t1", "unit"), run_tests("t2", "e2e"), apply_patch("p1", "not a diff"), open_pr("pr1")]

    response = api.invoke(batch_event({"jobs": jobs}))

    assert response.status == 422
    assert "nothing was accepted" in response.body["message"]
    assert set(response.field_errors()) == {"jobs.2.payload.patch"}  # what the body alone shows comes first
    jobs[2] = apply_patch("p1", PATCH)
    response = api.invoke(batch_event({"jobs": jobs}))
    assert response.status == 422
    assert response.field_errors() == {
        "jobs.1.payload.suite": "workspace w1 has no test suite 'e2e'; its suites are: lint, unit; name one of them, "
        "or add the suite with PUT /workspaces/w1",
        "jobs.3.workspaceId": "workspace w1 has no githubRepository, which an open_pr job opens its pull request on; "
        "add it (owner/repository) with PUT /workspaces/w1",
    }
    assert nothing_accepted(api)


# ---- how fresh the registration is ----------------------------------------------------------------------------------


def test_a_suite_added_by_another_process_is_never_refused(api: Api) -> None:
    # Given this process refused a suite, and so read the registration
    register(api.stack, testCommands=SUITES)
    assert api.post(run_tests("t1", "e2e")).status == 422

    # When the suite is added through another process of the API
    register(api.stack, testCommands={**SUITES, "e2e": ["make", "e2e"]})

    # Then the job naming it is accepted: a refusal is decided on a consistent read, never on a kept one
    assert api.post(run_tests("t1", "e2e")).status == 202


def test_a_job_that_fits_reads_the_registration_once_per_process(api: Api) -> None:
    register(api.stack, testCommands=SUITES, githubRepository="acme/w1")
    client = app.services().dynamodb
    calls: Counter[str] = Counter()
    client.meta.events.register("before-call.dynamodb", lambda model, **_: calls.update([model.name]))
    assert api.post(apply_patch("p0", PATCH)).status == 202  # the workspace's owner is read once, and kept
    calls.clear()

    assert api.post(run_tests("t1", "unit")).status == 202
    first = Counter(calls)
    calls.clear()
    assert api.post(run_tests("t2", "lint")).status == 202
    assert api.post(open_pr("pr1")).status == 202
    later = Counter(calls)
    calls.clear()
    assert api.post(apply_patch("p1", PATCH)).status == 202

    # the first read the registration; the later ones cost what a job without a registration to fit costs
    assert first["GetItem"] == calls["GetItem"] + 1
    assert later == calls + calls


def test_a_repeat_of_an_accepted_job_is_202_whatever_the_registration_says_now(api: Api) -> None:
    # Given a job accepted, then its suite taken out of the registration by another process
    register(api.stack, testCommands=SUITES)
    assert api.post(run_tests("t1", "unit")).status == 202
    register(api.stack, testCommands={"lint": SUITES["lint"]})

    # When the agent sends the same job again (it never saw the 202), or another job under its jobId
    again = api.post(run_tests("t1", "unit"))
    conflict = api.post(run_tests("t1", "e2e"))

    # Then the job is the one accepted (the worker refuses it if it runs without the suite), and the jobId is taken
    assert (again.status, again.body["created"]) == (202, False)
    assert conflict.status == 409
