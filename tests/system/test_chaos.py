"""The chaos suite: the whole system on the local runtime (moto's server over HTTP, the API over HTTP, worker
processes fed by the event-source poller), each workspace a real bare git remote registered through the API and a
fake GitHub for the pull requests, under every fault kind at once; order, exactly-once and halting checked from the
table, the remotes' branches and the pull requests GitHub holds. `make test` runs a small size; `make chaos` a larger
one (CHAOS_JOBS, CHAOS_WORKSPACES)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from agent_jobs_local.demo import run_demo
from agent_jobs_local.faults import Fault
from agent_jobs_local.workload import Report, WorkloadConfig

JOBS = int(os.environ.get("CHAOS_JOBS", "120"))
WORKSPACES = int(os.environ.get("CHAOS_WORKSPACES", "8"))
# The run is the module fixture, set up inside the first test: its time limit grows with the size, like the run's own.
pytestmark = pytest.mark.timeout(600 + 2 * JOBS)


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> Report:
    # Two of the four agents submit through the batch route, two one job at a time.
    config = WorkloadConfig(
        jobs=JOBS, workspaces=WORKSPACES, agents=4, crashes_per_kind=1, slow_jobs=1, seed=11, batch_agents=2
    )
    run_dir: Path = tmp_path_factory.mktemp("chaos")
    return run_demo(config, concurrency=4, run_dir=run_dir, drain_timeout=300 + JOBS)  # the demo's time scale


def test_chaos_every_fault_kind_was_injected(report: Report):
    assert {kind: count > 0 for kind, count in report.faults_injected.items()} == {str(f): True for f in Fault}
    assert report.invocation_crashes >= 4  # one per crash kind, at least
    assert report.invocation_timeouts >= 1  # the slow job
    assert report.cold_starts > report.invocation_crashes  # each crash and timeout was followed by a fresh process
    assert report.raw_redeliveries_sent > 0
    assert report.poison_sent == 1
    assert 0 < report.batch_accepted < report.accepted  # both ways of submitting were used
    assert report.api_repeats_absorbed > 0
    assert report.worker_duplicates_absorbed > 0


def test_chaos_exactly_once_no_double_apply_and_nothing_lost(report: Report):
    assert report.double_applies == []
    assert report.lost == []
    assert report.submission_errors == []
    assert report.accepted == JOBS + WORKSPACES  # every planned job (plus one pull request per workspace)


def test_chaos_order_per_workspace_matches_acceptance(report: Report):
    assert report.order_violations == []


def test_chaos_poison_halts_only_its_workspace(report: Report):
    assert set(report.halted) == report.expected_halted
    assert len(report.halted) == 1
    assert "rejected" in next(iter(report.halted.values()))
    assert report.parked > 0  # the jobs behind the poison wait, with their bodies, instead of applying
    assert report.incomplete_workspaces == []  # every other workspace finished all of its jobs


def test_chaos_one_pull_request_per_completed_workspace(report: Report):  # open_pr exactly once
    assert report.pull_requests_expected == WORKSPACES - len(report.expected_halted)  # all but the poisoned one
    assert report.pull_requests == report.pull_requests_expected
    assert report.workspaces_without_pull_request == []
    assert report.duplicate_pull_requests == []
    assert report.unexpected_pull_requests == []  # none for the halted workspace, whose open_pr is parked


def test_chaos_run_tests_ran_the_registered_command(report: Report):
    assert report.tests_succeeded > 0
    assert report.tests_passed == report.tests_succeeded
    assert report.tests_without_passed_result == []


def test_chaos_report_says_ok(report: Report):
    assert report.ok, report.failures
