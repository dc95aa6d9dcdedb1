"""The workspace-growth benchmark, quick run: the time of a job at three points of one workspace's life, beside the
same run without the trailer index, the push's own object walk and pack merging, and the first job on a repository
built with real git beside git clone + git am + git push. Figures only: times are never asserted (the machine is
shared and noisy)."""

from __future__ import annotations

import pytest

from agent_jobs_bench import workspace_growth


def test_workspace_growth_quick_run_reports_each_point_beside_the_run_without_the_fixes() -> None:
    figures = {figure.name: figure for figure in workspace_growth.run(quick=True)}

    jobs = workspace_growth.QUICK_JOBS
    points = [f"apply_patch at job {point:,} of a workspace" for point in (1, jobs // 3, jobs)]
    ratio = f"apply_patch time, job {jobs:,} / job 1"
    large = "first apply_patch on a large repository (cold cache)"
    assert sorted(figures) == sorted([*points, ratio, large])
    for name in points:
        assert figures[name].unit == "ms"
        assert figures[name].value > 0
        assert figures[name].baseline is not None  # the quick run takes the baseline to its last point
    # the ratio of the unrounded medians: within the rounding of the two figures
    assert figures[ratio].value == pytest.approx(figures[points[-1]].value / figures[points[0]].value, abs=0.02)
    assert figures[large].unit == "s"
    assert figures[large].baseline is not None
    assert f"{workspace_growth.QUICK_LARGE_COMMITS} commits" in figures[large].note
    assert all(figure.command == workspace_growth.COMMAND for figure in figures.values())
