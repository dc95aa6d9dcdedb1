"""The group-parallel benchmark's quick run: its figures and their structure (counts and names, never times)."""

from __future__ import annotations

from agent_jobs_bench import group_parallel
from agent_jobs_bench.figures import Comparison


def test_group_parallel_quick_run_reports_each_comparison_against_a_baseline_of_the_same_run() -> None:
    figures = group_parallel.run(quick=True)

    assert [figure.name for figure in figures] == [
        "10 jobs over 10 groups, group-parallel worker vs the naive sequential loop",
        "10 jobs over 10 groups, group-parallel worker vs GROUP_CONCURRENCY=1",
        "10 jobs over 1 group, group-parallel worker vs GROUP_CONCURRENCY=1",
        "10 jobs over 1 group, group-parallel worker vs the naive sequential loop",
        "10 jobs over 10 groups without IO (the floor), group-parallel worker vs the naive sequential loop",
    ]
    for figure in figures:
        assert figure.benchmark == group_parallel.BENCHMARK
        assert figure.command == ".venv/bin/python -m agent_jobs_bench --only group_parallel"
        assert figure.unit == "s"
        assert figure.value > 0
        assert figure.baseline is not None
        assert figure.baseline > 0
        assert figure.goal_on == "ratio"
        assert figure.ratio is not None
        assert "moto's server over HTTP" in figure.note
    goals = [figure.goal for figure in figures]
    assert [goal.value if goal else None for goal in goals] == [0.2, 0.2, 1.05, 1.05, None]
    assert all(goal.comparison is Comparison.AT_MOST for goal in goals if goal)
