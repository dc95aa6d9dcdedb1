"""The demo's report as printed: "ok" or "FAIL" only beside a line that checked something, and a halted workspace's
reason whole."""

from __future__ import annotations

import io
from typing import Any

from rich.console import Console

from agent_jobs_local.demo import print_report
from agent_jobs_local.workload import Report

# As the worker words a poison job's halt: longer than a table's column, with brackets rich would read as markup.
POISON_REASON = (
    "job poison-1 failed permanently: apply_patch: the patch does not apply to src/app.py [hunk 1 of 1 at line 3:"
    " expected 'x = 1', found 'x = 2']; fix the patch or resume the workspace with --skip to drop it ...and the end"
)


def report(**changes: Any) -> Report:
    """A report of a run in which every invariant held, with `changes`."""
    fields: dict[str, Any] = {
        "accepted": 40,
        "applied": 36,
        "parked": 2,
        "rejected": 1,
        "dead": 1,
        "lost": [],
        "double_applies": [],
        "order_violations": [],
        "halted": {"ws-3": POISON_REASON},
        "expected_halted": {"ws-3"},
        "incomplete_workspaces": [],
        "api_repeats_absorbed": 3,
        "worker_duplicates_absorbed": 2,
        "raw_redeliveries_sent": 2,
        "poison_sent": 1,
        "faults_injected": {"crash_after_claim": 2, "slow": 1},
        "invocation_crashes": 2,
        "invocation_timeouts": 1,
        "cold_starts": 4,
        "invocations": 30,
        "submission_errors": [],
        "workspaces": 4,
        "seconds": 12.5,
        "pull_requests": 3,
        "pull_requests_expected": 3,
    }
    return Report(**(fields | changes))


def printed(run: Report) -> list[str]:
    out = io.StringIO()
    print_report(run, Console(file=out, width=100, color_system=None))
    return out.getvalue().splitlines()


def verdict(lines: list[str], what: str) -> str:
    """The third cell of the table's row that starts with `what`: "ok", "FAIL" or ""."""
    (cells,) = [line.split("│")[1:4] for line in lines if line.startswith(f"│ {what}")]
    return cells[2].strip()


def test_demo_report_marks_ok_only_the_lines_that_checked_something() -> None:
    lines = printed(report())

    informational = ["jobs accepted (202", "workspaces ", "jobs applied", "invocations / cold starts", "seconds"]
    checks = ["double applies", "lost jobs", "per-workspace order", "fault injected: slow", "submissions failed"]
    assert [verdict(lines, what) for what in informational] == [""] * len(informational)
    assert [verdict(lines, what) for what in checks] == ["ok"] * len(checks)


def test_demo_report_marks_a_broken_check_fail_and_says_why() -> None:
    lines = printed(report(lost=["job-7=QUEUED"]))

    assert verdict(lines, "lost jobs") == "FAIL"
    assert "FAILED 1 lost jobs: ['job-7=QUEUED']" in lines


def test_demo_report_prints_a_halt_reason_whole() -> None:
    lines = printed(report())

    assert f"halted ws-3: {POISON_REASON}" in lines


def test_demo_report_prints_an_unexpected_halt_reason_whole_in_the_failure() -> None:
    lines = printed(report(expected_halted=set()))

    assert verdict(lines, "halted workspaces") == "FAIL"
    assert any(line.startswith("FAILED halted workspaces") and line.endswith(POISON_REASON + ")") for line in lines)
