"""`agent-jobs workspaces register`: the body of PUT /workspaces/{id} from options made from the registration model,
against a real local runtime; the API's refusals in its own words."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import BaseModel

from agent_jobs_cli.commands.registration import registration_body, registration_options
from agent_jobs_local.workload import create_remote, remote_path
from tests.cli.conftest import TENANT, CliHarness


def test_workspaces_register_registers_a_workspace_whose_jobs_run(cli: CliHarness) -> None:
    remote = create_remote(remote_path(cli.runtime.remotes_root, "ws-reg-a", TENANT), "ws-reg-a")

    # When the workspace is registered through the CLI
    registered = cli.run(
        "workspaces",
        "register",
        "ws-reg-a",
        "--remote-url",
        str(remote),
        "--branch",
        "agent/ws-reg-a",
        "--test-command",
        "unit=python3 -c 'print(\"tests pass\")'",
        "--test-command",
        "lint=true",
        "--github-repository",
        "acme/ws-reg-a",
        "--json",
    )

    # Then the API holds what the options said, the command split into words without a shell
    assert registered.exit_code == 0, registered.output
    view = json.loads(registered.stdout)
    assert view["remoteUrl"] == str(remote)
    assert view["branch"] == "agent/ws-reg-a"
    assert view["baseBranch"] == "main"
    assert view["testCommands"] == {"unit": ["python3", "-c", 'print("tests pass")'], "lint": ["true"]}
    assert view["githubRepository"] == "acme/ws-reg-a"
    # and a job runs on it
    assert cli.enqueue_patch("ws-reg-a", "reg-a-1").exit_code == 0
    assert cli.run("watch", "ws-reg-a", "--until-idle", "--interval", "0.2", "--timeout", "90").exit_code == 0
    assert cli.run_json("status", "job", "reg-a-1")["status"] == "SUCCEEDED"
    # and registering again replaces the registration, and says so
    again = cli.run("workspaces", "register", "ws-reg-a", "--remote-url", str(remote), "--branch", "agent/other")
    assert again.exit_code == 0, again.output
    assert "ws-reg-a registration updated" in again.stdout
    assert cli.run_json("status", "workspace", "ws-reg-a")["branch"] == "agent/other"


def test_workspaces_register_makes_a_relative_remote_path_absolute(
    cli: CliHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    remote = create_remote(remote_path(cli.runtime.remotes_root, "ws-reg-rel", TENANT), "ws-reg-rel")
    monkeypatch.chdir(remote.parent)

    result = cli.run(
        "workspaces", "register", "ws-reg-rel", "--remote-url", remote.name, "--branch", "agent/x", "--json"
    )

    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["remoteUrl"] == str(remote)


def test_workspaces_register_shows_the_apis_refusal_in_its_words(cli: CliHarness, tmp_path: Path) -> None:
    # Given a remote outside the tenant's folder of the remotes root
    outside = create_remote(tmp_path / "elsewhere.git", "elsewhere")

    result = cli.run("workspaces", "register", "ws-reg-out", "--remote-url", str(outside), "--branch", "agent/x")

    assert result.exit_code == 1
    assert "PUT /workspaces/ws-reg-out answered 422" in result.stderr
    assert "remoteUrl: remoteUrl must be a path under" in result.stderr
    assert "(this tenant's remotes)" in result.stderr


def test_workspaces_register_names_the_missing_options_before_sending(cli: CliHarness) -> None:
    result = cli.run("workspaces", "register", "ws-reg-none", "--base-branch", "trunk")

    assert result.exit_code == 1
    assert "a registration needs --remote-url (remoteUrl) and --branch (branch)" in result.stderr
    assert cli.run("status", "workspace", "ws-reg-none").exit_code == 1


def test_workspaces_register_reads_a_registration_file_under_the_options(cli: CliHarness) -> None:
    remote = create_remote(remote_path(cli.runtime.remotes_root, "ws-reg-file", TENANT), "ws-reg-file")
    document = cli.root / "registration.json"
    document.write_text(json.dumps({"remoteUrl": str(remote), "branch": "agent/from-file", "baseBranch": "main"}))

    result = cli.run("workspaces", "register", "ws-reg-file", "--file", str(document), "--branch", "agent/option")

    assert result.exit_code == 0, result.output
    view = cli.run_json("status", "workspace", "ws-reg-file")
    assert (view["remoteUrl"], view["branch"]) == (str(remote), "agent/option")


def test_workspaces_register_has_an_option_for_each_field_of_a_grown_model() -> None:
    # Given a registration model with fields of every kind beyond today's
    class GrownRegistration(BaseModel):
        remote_url: str
        producer_queue_url: str | None = None
        max_parallel_checkouts: int | None = None
        allow_force_push: bool = False
        labels: list[str] = []

    options = {option.flag: option for option in registration_options(GrownRegistration)}

    assert list(options) == [
        "--remote-url",
        "--producer-queue-url",
        "--max-parallel-checkouts",
        "--allow-force-push",
        "--labels",
    ]
    assert [option.kind for option in options.values()] == ["text", "text", "number", "switch", "json"]
    given = {
        "field_remote_url": "/srv/git/repo.git",
        "field_producer_queue_url": "https://sqs.example/q",
        "field_max_parallel_checkouts": 2,
        "field_allow_force_push": True,
        "field_labels": '["a", "b"]',
    }
    assert registration_body(list(options.values()), given, None) == {
        "remote_url": "/srv/git/repo.git",
        "producer_queue_url": "https://sqs.example/q",
        "max_parallel_checkouts": 2,
        "allow_force_push": True,
        "labels": ["a", "b"],
    }


def test_workspaces_register_help_lists_every_field_of_the_registration(cli: CliHarness) -> None:
    result = cli.run("workspaces", "register", "--help")

    assert result.exit_code == 0
    for option in registration_options():
        assert option.flag in result.stdout


def test_cli_unregistered_workspace_names_the_register_command(cli: CliHarness) -> None:
    result = cli.run("status", "workspace", "ws-never-registered")

    assert result.exit_code == 1
    assert "answered 404" in result.stderr
    assert "agent-jobs workspaces register ws-never-registered --remote-url REMOTE --branch BRANCH" in result.stderr
