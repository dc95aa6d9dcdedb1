"""Names one tenant could take or probe from another: jobIds squatted before their owner uses them (through the
single and the batch route, and at the queue's deduplication), and answers that would tell which jobIds and
workspaceIds another tenant uses."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from enqueue_api import app
from tests.conftest import Stack, register_workspace
from tests.integration.test_batch_enqueue import batch_event
from tests.integration.test_enqueue_api import Api, get_event, job_body, post_event, use_environment

ATTACKER = {"tenant_id": "mallory", "sub": "mallory-agent"}
VICTIM = {"tenant_id": "acme", "sub": "acme-agent"}


@pytest.fixture
def api(stack: Stack, monkeypatch: pytest.MonkeyPatch) -> Iterator[Api]:
    use_environment(monkeypatch, stack.env("EnqueueApiFunction"))
    register_workspace(stack, "acme-repo", "acme")
    register_workspace(stack, "mallory-repo", "mallory")
    yield Api(stack)
    app.reset_services()


def test_jobids_squatted_by_another_tenant_stay_free_for_their_owner(api: Api) -> None:
    # Given mallory takes the jobIds acme's agents will use next, one by one and in a batch, a moment before acme
    squatted = ["acme-job-1", "acme-job-2", "acme-job-3"]
    assert api.invoke(post_event(job_body(squatted[0], "mallory-repo"), claims=ATTACKER), register=False).status == 202
    batch = {"jobs": [job_body(job_id, "mallory-repo") for job_id in squatted[1:]]}
    taken = api.invoke(batch_event(batch, claims=ATTACKER), register=False)
    assert [result["statusCode"] for result in taken.body["results"]] == [202, 202]

    # When acme sends its jobs of those jobIds, within the queue's deduplication window
    single = api.invoke(post_event(job_body(squatted[0], "acme-repo"), claims=VICTIM), register=False)
    own_batch = {"jobs": [job_body(job_id, "acme-repo") for job_id in squatted[1:]]}
    batched = api.invoke(batch_event(own_batch, claims=VICTIM), register=False)

    # Then every one is acme's new job, and every one reached the queue: none was taken for a duplicate of mallory's
    assert (single.status, single.body["created"]) == (202, True)
    assert [(r["statusCode"], r["created"]) for r in batched.body["results"]] == [(202, True), (202, True)]
    groups = [record["attributes"]["MessageGroupId"] for record in api.drain()]
    assert sorted(groups) == ["ws#acme-repo"] * 3 + ["ws#mallory-repo"] * 3
    for job_id in squatted:
        assert api.stack.job(job_id, "acme")["workspaceId"] == "acme-repo"
        assert api.stack.job(job_id, "mallory")["workspaceId"] == "mallory-repo"


def test_answers_tell_nothing_of_another_tenants_ids(api: Api) -> None:
    # Given acme's job in acme's workspace
    assert api.invoke(post_event(job_body("acme-job", "acme-repo"), claims=VICTIM), register=False).status == 202

    def probe(event: dict[str, object]) -> tuple[int, str]:
        answer = api.invoke(event, register=False)
        return answer.status, str(answer.body.get("message"))

    # When mallory probes acme's jobId and workspaceId, and ids nobody uses
    job_of_acme = probe(get_event("acme-job", claims=ATTACKER))
    no_job = probe(get_event("nobodys-job", claims=ATTACKER))
    send_to_acme = probe(post_event(job_body("probe-1", "acme-repo"), claims=ATTACKER))
    send_to_nobody = probe(post_event(job_body("probe-1", "nobodys-repo"), claims=ATTACKER))

    # Then each pair is answered alike, but for the id itself
    assert job_of_acme[0] == no_job[0] == 404
    assert job_of_acme[1].replace("acme-job", "X") == no_job[1].replace("nobodys-job", "X")
    assert send_to_acme[0] == send_to_nobody[0] == 404
    assert send_to_acme[1].replace("acme-repo", "X") == send_to_nobody[1].replace("nobodys-repo", "X")
    assert api.stack.job("probe-1", "mallory") is None
