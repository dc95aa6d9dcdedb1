"""The cold-first-job benchmark, quick run: the first job on a cold cache of two repositories with the same tip and
histories 40x apart, over a file remote and smart HTTP, each beside git clone --depth 1 + apply + commit + push, with
the goal rows. Figures only: times and memory are never asserted against their goals (the machine is shared and
noisy)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from agent_jobs_bench import cold_first_job
from agent_jobs_bench.figures import Figure


def test_cold_first_job_quick_run_reports_each_case_beside_the_shallow_clone(monkeypatch: pytest.MonkeyPatch) -> None:
    # the quick run leaves real repositories out, even when some are named
    monkeypatch.setenv(cold_first_job.REPOS_VARIABLE, "/nowhere/a.git")
    figures = {figure.name: figure for figure in cold_first_job.run(quick=True)}

    small = f"synthetic, {cold_first_job.QUICK_SMALL_COMMITS:,} commits"
    large = f"synthetic, {cold_first_job.QUICK_LARGE_COMMITS:,} commits"
    times, memory, ratios = [], [], []
    for where in ("file remote", "smart HTTP"):
        for label in (small, large):
            times.append(f"first apply_patch, cold cache, {label} ({where})")
            memory.append(f"worker peak RSS, first apply_patch, {label} ({where})")
        ratios.append(
            f"first apply_patch, {cold_first_job.QUICK_LARGE_COMMITS:,} / {cold_first_job.QUICK_SMALL_COMMITS:,}"
            f" commits ({where})"
        )
    assert sorted(figures) == sorted([*times, *memory, *ratios])
    for name in times:
        baseline = measured_beside_a_baseline(figures[name], "s")
        # the goal is the baseline's time, twice, plus a second
        goal = figures[name].goal
        assert goal is not None
        assert goal.value == pytest.approx(2 * baseline + 1, abs=0.02)
    for name in memory:
        measured_beside_a_baseline(figures[name], "MiB")
        assert figures[name].goal == cold_first_job.RSS_GOAL
    for name in ratios:
        assert figures[name].value > 0
        assert figures[name].goal == cold_first_job.HISTORY_GOAL
    assert all(figure.met is not None for figure in figures.values())
    assert all(figure.command == cold_first_job.COMMAND for figure in figures.values())


def test_peak_memory_is_the_commands_own_not_the_process_that_started_it(tmp_path: Path) -> None:
    # A command that uses next to no memory shows a few MiB, though this process (pytest, dulwich, pydantic...) holds
    # far more: Linux counts the memory a process was started from into its peak, so the launcher starts it
    ballast = bytearray(64 * 1024 * 1024)  # this process's peak: at least 64 MiB
    floor = cold_first_job.launcher_floor(tmp_path)
    _, used = cold_first_job.run_measured(
        ["python3", "-c", "x = bytearray(40 * 1024 * 1024); x[::4096] = b'1' * len(x[::4096])"],
        cwd=tmp_path,
        env=dict(os.environ),
    )
    assert floor < 32 * 1024 * 1024 < len(ballast)
    assert floor + 35 * 1024 * 1024 < used < floor + 64 * 1024 * 1024


def measured_beside_a_baseline(figure: Figure, unit: str) -> float:
    """Check that `figure` is a positive value in `unit` beside a positive baseline; returns the baseline."""
    assert figure.unit == unit
    assert figure.value > 0
    assert figure.baseline is not None
    assert figure.baseline > 0
    return figure.baseline
