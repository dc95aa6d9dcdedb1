"""The end-to-end benchmark on the local runtime (quick mode: counts and structure, never times)."""

from __future__ import annotations

from typing import Any

import pytest

from agent_jobs_bench import end_to_end


def test_end_to_end_quick_run_reports_latency_and_throughput_per_workspace_count(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given the levels the benchmark measures are kept
    measured: list[Any] = []
    measure = end_to_end.measure

    def kept(counts: Any, jobs_per_workspace: int) -> Any:
        measured.extend(measure(counts, jobs_per_workspace))
        return measured

    monkeypatch.setattr(end_to_end, "measure", kept)

    # When the quick benchmark runs
    figures = end_to_end.run(quick=True)

    # Then each workspace count had every one of its jobs applied, in a latency level and a backlog level
    counts = end_to_end.QUICK_WORKSPACE_COUNTS
    per_workspace = end_to_end.QUICK_JOBS_PER_WORKSPACE
    assert [(latency.workspaces, backlog.workspaces) for latency, backlog in measured] == [(c, c) for c in counts]
    for latency, backlog in measured:
        assert latency.jobs == backlog.jobs == latency.workspaces * per_workspace
        assert len(latency.latencies) == latency.jobs
    # And each count has its p50, p99 and throughput figures, the throughput against the 1-workspace throughput
    names = [figure.name for figure in figures]
    for count in counts:
        label = f"{count} workspace{'s' if count > 1 else ''}"
        assert [f"latency p50, {label}", f"latency p99, {label}", f"throughput, {label}"] == [
            name for name in names if name.endswith(f", {label}")
        ]
    throughputs = [figure for figure in figures if figure.name.startswith("throughput, ")]
    assert {figure.baseline for figure in throughputs} == {throughputs[0].value}
    growth = figures[-1]
    assert growth.goal is not None
    assert growth.goal_on == "ratio"
    assert growth.met is not None
    assert growth.baseline == throughputs[0].value
