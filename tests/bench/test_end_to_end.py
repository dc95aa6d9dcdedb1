"""The end-to-end benchmark on the local runtime (quick mode: counts and structure, never times)."""

from __future__ import annotations

from typing import Any

import pytest

from agent_jobs_bench import end_to_end


def test_end_to_end_quick_run_reports_latency_and_throughput_per_workspace_count(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given the levels the benchmark measures are kept
    measured: dict[float, Any] = {}
    naive: dict[float, Any] = {}
    measure = end_to_end.measure

    def kept(counts: Any, jobs_per_workspace: int, side_effects: Any, *, naive_pattern: bool = False) -> Any:
        levels = measure(counts, jobs_per_workspace, side_effects, naive_pattern=naive_pattern)
        (naive if naive_pattern else measured).update(levels)
        return levels

    monkeypatch.setattr(end_to_end, "measure", kept)
    backlogs: list[Any] = []
    measure_backlog = end_to_end.measure_backlog

    def kept_backlog(batch_size: int, jobs: int) -> Any:
        backlogs.append(measure_backlog(batch_size, jobs))
        return backlogs[-1]

    monkeypatch.setattr(end_to_end, "measure_backlog", kept_backlog)

    # When the quick benchmark runs
    figures = end_to_end.run(quick=True)

    # Then in each series each workspace count had every one of its jobs applied
    counts = end_to_end.QUICK_WORKSPACE_COUNTS
    per_workspace = end_to_end.QUICK_JOBS_PER_WORKSPACE
    assert list(measured) == list(naive) == list(end_to_end.SIDE_EFFECTS)
    for levels in [*measured.values(), *naive.values()]:
        assert [level.workspaces for level in levels] == list(counts)
        for level in levels:
            assert level.jobs == level.workspaces * per_workspace
            assert len(level.latencies) == level.jobs
    # And each series has p50, p99 and throughput for each count, the throughput against its 1-workspace throughput
    for seconds in end_to_end.SIDE_EFFECTS:
        series = end_to_end.series_name(seconds)
        in_series = [figure for figure in figures if figure.name.startswith(f"{series}: ")]
        for count in counts:
            label = f"{count} workspace{'s' if count > 1 else ''}"
            assert [figure.name for figure in in_series if figure.name.endswith(f", {label}")] == [
                f"{series}: latency p50, {label}",
                f"{series}: latency p99, {label}",
                f"{series}: throughput, {label}",
            ]
        # The latencies beside the naive pattern's at the same workspace count, in the same run
        p50s = [figure for figure in in_series if figure.name.startswith(f"{series}: latency p50, ")]
        assert [figure.baseline for figure in p50s] == [level.percentile(0.5) * 1000 for level in naive[seconds]]
        throughputs = [figure for figure in in_series if figure.name.startswith(f"{series}: throughput, ")]
        assert len(throughputs) == len(counts)
        assert {figure.baseline for figure in throughputs} == {throughputs[0].value}
        growth = in_series[-1]
        assert growth.baseline == throughputs[0].value
        assert growth.goal_on == "ratio"
        assert (growth.goal is not None) == bool(seconds)  # the growth goal is on the series with a side effect
    # And the backlog on one workspace was drained (in order: measure_backlog checks it) at each batch size, each
    # throughput against BatchSize 1's
    assert [(backlog.batch_size, backlog.jobs) for backlog in backlogs] == [
        (size, end_to_end.QUICK_BACKLOG_JOBS) for size in end_to_end.BACKLOG_BATCH_SIZES
    ]
    backlog = [figure for figure in figures if figure.name.startswith("backlog of ")]
    assert [figure.name for figure in backlog] == [
        f"backlog of {end_to_end.QUICK_BACKLOG_JOBS} small patches on 1 workspace: throughput, BatchSize {size}"
        for size in end_to_end.BACKLOG_BATCH_SIZES
    ]
    assert {figure.baseline for figure in backlog} == {backlogs[0].throughput}
