"""GitHubClient over real HTTP against a fake GitHub on localhost: idempotent creation, retries, and clear refusals."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from agent_jobs_local.fake_github import FakeGitHub
from job_worker.jobs.errors import PermanentJobError, RetryableJobError
from job_worker.jobs.github import GitHubClient, PullRequest

TOKEN = "ghp_fake_token_0123456789abcdef"
OWNER, REPO, HEAD, BASE = "acme", "widgets", "agent/ws-1", "main"


@pytest.fixture
def github() -> Iterator[FakeGitHub]:
    fake = FakeGitHub(token=TOKEN)
    fake.add_repository(OWNER, REPO)
    with fake.running():
        yield fake


@pytest.fixture
def sleeps() -> list[float]:
    return []


def client_for(fake: FakeGitHub, sleeps: list[float], *, token: str = TOKEN, max_attempts: int = 4) -> GitHubClient:
    return GitHubClient(token, api_url=fake.base_url, timeout=5, max_attempts=max_attempts, sleep=sleeps.append)


def open_pr(client: GitHubClient, owner: str = OWNER, repo: str = REPO) -> PullRequest:
    return client.open_pull_request(owner, repo, head=HEAD, base=BASE, title="Agent changes", body="From the agent.")


def test_github_creates_a_pull_request_when_none_is_open(github: FakeGitHub, sleeps: list[float]):
    pull = open_pr(client_for(github, sleeps))

    assert pull == PullRequest(number=1, url=f"https://github.example/{OWNER}/{REPO}/pull/1", created=True)
    assert [request.method for request in github.requests] == ["GET", "POST"]
    lookup, create = github.requests
    assert lookup.path == f"/repos/{OWNER}/{REPO}/pulls"
    assert lookup.query == {"head": f"{OWNER}:{HEAD}", "base": BASE, "state": "open", "per_page": "100"}
    assert create.body == {"title": "Agent changes", "head": HEAD, "base": BASE, "body": "From the agent."}
    assert len(github.open_pulls(OWNER, REPO, HEAD)) == 1
    assert sleeps == []


def test_github_sends_the_token_and_api_headers(github: FakeGitHub, sleeps: list[float]):
    open_pr(client_for(github, sleeps))

    for request in github.requests:
        assert request.headers["authorization"] == f"Bearer {TOKEN}"
        assert request.headers["accept"] == "application/vnd.github+json"
        assert request.headers["x-github-api-version"] == "2022-11-28"
        assert request.headers["user-agent"]
    assert github.requests_of("POST")[0].headers["content-type"] == "application/json"


def test_github_returns_the_open_pull_request_without_creating_another(github: FakeGitHub, sleeps: list[float]):
    # Given an open pull request of the head branch (an earlier attempt of this job opened it)
    existing = github.add_pull(OWNER, REPO, head=HEAD, base=BASE)

    pull = open_pr(client_for(github, sleeps))

    assert pull == PullRequest(existing.number, f"https://github.example/{OWNER}/{REPO}/pull/1", created=False)
    assert github.requests_of("POST") == []
    assert len(github.open_pulls(OWNER, REPO, HEAD)) == 1


def test_github_ignores_pull_requests_of_other_branches(github: FakeGitHub, sleeps: list[float]):
    github.add_pull(OWNER, REPO, head="agent/other", base=BASE)

    pull = open_pr(client_for(github, sleeps))

    assert (pull.number, pull.created) == (2, True)


def test_github_race_lost_to_another_worker_returns_its_pull_request(github: FakeGitHub, sleeps: list[float]):
    # Given another worker opens the pull request between our lookup and our create (GitHub answers 422)
    github.race_next_create = True

    pull = open_pr(client_for(github, sleeps))

    assert (pull.number, pull.created) == (1, False)
    assert [request.method for request in github.requests] == ["GET", "POST", "GET"]
    assert len(github.open_pulls(OWNER, REPO, HEAD)) == 1
    assert len(github.pulls) == 1


def test_github_retries_server_errors_then_succeeds(github: FakeGitHub, sleeps: list[float]):
    github.fail_next(2, 502, method="GET")
    github.fail_next(1, 500, method="POST")

    pull = open_pr(client_for(github, sleeps))

    assert (pull.number, pull.created) == (1, True)
    assert [request.method for request in github.requests] == ["GET", "GET", "GET", "POST", "POST"]
    assert len(sleeps) == 3
    # exponential backoff with jitter: base 0.5 s doubled per attempt, each drawn from [half, all] of it
    assert 0.25 <= sleeps[0] <= 0.5
    assert 0.5 <= sleeps[1] <= 1.0
    assert 0.25 <= sleeps[2] <= 0.5


def test_github_gives_up_on_persistent_server_errors_as_retryable(github: FakeGitHub, sleeps: list[float]):
    github.fail_next(10, 503)

    with pytest.raises(RetryableJobError, match=r"503 to GET .* gave up after 3 attempts") as raised:
        open_pr(client_for(github, sleeps, max_attempts=3))

    assert len(github.requests) == 3
    assert len(sleeps) == 2  # no sleep after the last attempt
    assert TOKEN not in str(raised.value)


def test_github_honours_retry_after_on_429(github: FakeGitHub, sleeps: list[float]):
    github.fail_next(1, 429, headers={"retry-after": "3"})

    pull = open_pr(client_for(github, sleeps))

    assert pull.created is True
    assert sleeps == [3.0]


def test_github_waits_for_the_rate_limit_reset_on_403(github: FakeGitHub, sleeps: list[float]):
    github.rate_limit_next(1, reset_in_seconds=2)

    pull = open_pr(client_for(github, sleeps))

    assert pull.created is True
    assert len(sleeps) == 1
    assert 1.0 <= sleeps[0] <= 4.0


def test_github_does_not_wait_longer_than_its_cap_for_a_rate_limit(github: FakeGitHub, sleeps: list[float]):
    # Given a reset an hour away: the queue's backoff, not a sleeping worker, should wait for it
    github.rate_limit_next(1, reset_in_seconds=3600)

    with pytest.raises(RetryableJobError, match="API rate limit exceeded"):
        open_pr(client_for(github, sleeps))

    assert sleeps == []
    assert len(github.requests) == 1


def test_github_retries_network_errors_then_gives_up(sleeps: list[float]):
    # Given a port nobody listens on
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    client = GitHubClient(TOKEN, api_url=f"http://127.0.0.1:{port}", timeout=2, max_attempts=3, sleep=sleeps.append)

    with pytest.raises(RetryableJobError, match="could not reach GitHub") as raised:
        open_pr(client)

    assert len(sleeps) == 2
    assert TOKEN not in str(raised.value)


def test_github_bad_token_is_permanent_and_says_to_rotate_it(github: FakeGitHub, sleeps: list[float]):
    wrong_token = "ghp_revoked_token_fedcba9876543210"

    with pytest.raises(PermanentJobError) as raised:
        open_pr(client_for(github, sleeps, token=wrong_token))

    message = str(raised.value)
    assert f"GitHub answered 401 to GET /repos/{OWNER}/{REPO}/pulls for {OWNER}/{REPO}" in message
    assert "token is missing or invalid" in message
    assert "rotate the workspace's token" in message
    assert wrong_token not in message
    assert TOKEN not in message
    assert wrong_token not in repr(client_for(github, sleeps, token=wrong_token))
    assert len(github.requests) == 1  # not retried
    assert sleeps == []


def test_github_unknown_repository_is_permanent_and_says_what_to_check(github: FakeGitHub, sleeps: list[float]):
    with pytest.raises(PermanentJobError) as raised:
        open_pr(client_for(github, sleeps), repo="no-such-repo")

    message = str(raised.value)
    assert f"GitHub answered 404 to GET /repos/{OWNER}/no-such-repo/pulls for {OWNER}/no-such-repo" in message
    assert "does not exist or the token cannot see it" in message
    assert TOKEN not in message
    assert len(github.requests) == 1


def test_github_forbidden_without_rate_limit_is_permanent(github: FakeGitHub, sleeps: list[float]):
    github.fail_next(1, 403)

    with pytest.raises(PermanentJobError, match="Pull requests: write"):
        open_pr(client_for(github, sleeps))

    assert len(github.requests) == 1


def test_github_other_validation_failures_are_permanent(github: FakeGitHub, sleeps: list[float]):
    client = client_for(github, sleeps)

    with pytest.raises(PermanentJobError, match=r"422: Validation Failed; missing_field\); check that both branches"):
        client.open_pull_request(OWNER, REPO, head=HEAD, base=BASE, title=None, body="")  # type: ignore[arg-type]


def test_github_refuses_names_that_would_change_the_path(github: FakeGitHub, sleeps: list[float]):
    with pytest.raises(PermanentJobError, match="not a GitHub repository name"):
        open_pr(client_for(github, sleeps), repo="widgets/../../admin")

    assert github.requests == []


def test_github_enterprise_base_url_path_prefix_is_honoured(sleeps: list[float]):
    fake = FakeGitHub(token=TOKEN, path_prefix="/api/v3")
    fake.add_repository(OWNER, REPO)
    with fake.running():
        assert fake.base_url.endswith("/api/v3")
        client = GitHubClient(TOKEN, api_url=fake.base_url + "/", sleep=sleeps.append)

        pull = open_pr(client)

    assert pull.created is True
    assert [request.path for request in fake.requests] == [f"/api/v3/repos/{OWNER}/{REPO}/pulls"] * 2


def test_github_does_not_follow_redirects_with_the_token(github: FakeGitHub, sleeps: list[float]):
    # Given a redirect elsewhere (urllib would resend the Authorization header to wherever it points)
    github.fail_next(1, 301, headers={"location": "http://127.0.0.1:9/repositories/1/pulls"})

    with pytest.raises(PermanentJobError, match=r"moved to http://127\.0\.0\.1:9/repositories/1/pulls; update"):
        open_pr(client_for(github, sleeps))

    assert len(github.requests) == 1
