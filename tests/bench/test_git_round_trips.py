"""The git round-trips benchmark, quick run: the counts it reports are the ones the worker makes (the tests in
tests/git assert them per case), against the naive fetch-then-push of the same run."""

from __future__ import annotations

from agent_jobs_bench import git_round_trips


def test_git_round_trips_quick_run_reports_one_push_per_warm_job_against_a_fetch_and_a_push() -> None:
    figures = {figure.name: figure for figure in git_round_trips.run(quick=True)}

    warm = figures["git round trips per apply_patch, warm cache, happy path (file remote)"]
    assert (warm.value, warm.baseline, warm.met) == (1, 2, True)
    cold = figures["git round trips of the first apply_patch, cold cache (file remote)"]
    assert (cold.value, cold.met) == (2, True)
    http = figures["HTTP requests per apply_patch, warm cache, happy path (smart HTTP, dulwich.web)"]
    assert http.value == 2
    assert http.baseline is not None
    assert http.baseline > http.value
    latency = figures["apply_patch latency at 100 ms per request, warm cache (median)"]
    # timings are reported beside their baseline, never asserted (the machine is shared and noisy)
    assert latency.unit == "ms"
    assert latency.baseline is not None
    assert all(figure.command == git_round_trips.COMMAND for figure in figures.values())
