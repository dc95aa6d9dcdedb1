"""The capacity plan's small-scale predictions, checked against the local runtime: timed jobs over three folder
workspaces at a fixed rate (utilisation 60% each), measured beside what `agent-jobs plan` predicts for them.

The tolerances are about the model, not about speed: the concurrency the runtime reaches never exceeds the plan's
cap and its mean is the plan's Little's law figure within a factor of 2; each workspace's measured delay is at least
what one server per workspace must impose on these very arrivals, and between 0.5 and 2.5 times the plan's M/D/1
wait (the measurement adds the API-to-poller pickup and the claim; a short run starts from empty queues, which keeps
its mean below the steady state's; M/M/1's wait, twice M/D/1's, would fall outside)."""

from __future__ import annotations

import pytest

from agent_jobs_bench.plan import COMMAND, compare, figures, measure


def test_plan_predictions_hold_on_the_local_runtime() -> None:
    # Given 3 workspaces receiving 10 jobs each, every job taking 20 scenario seconds (2 s at time_scale 0.1)
    measurement = measure(workspaces=3, jobs_per_workspace=10)
    check = compare(measurement)

    # Then every job ran once, in one invocation of its own
    assert len(measurement.accepted) == 30
    assert set(measurement.handler) == set(measurement.accepted)
    assert len(measurement.invocation_seconds) == 30
    # and the concurrency stayed within the plan's cap, its mean near rate x duration
    assert check.concurrency_cap == 3
    assert 1 <= check.max_concurrent_invocations <= check.concurrency_cap
    assert check.predicted_concurrency == pytest.approx(1.8)  # 3 workspaces x 60%
    assert 0.5 <= check.measured_concurrency / check.predicted_concurrency <= 2.0
    # and each workspace waited at least what a single server per workspace imposes on these arrivals (2% slack for
    # the clocks of two processes), and between 0.5 and 2.5 times the plan's M/D/1 wait (M/M/1's would be twice it)
    nominal_floor = measurement.lindley_wait(measurement.job_seconds) / measurement.time_scale
    assert check.measured_wait >= 0.98 * nominal_floor
    assert 0.5 <= check.measured_wait / check.predicted_wait <= 2.5

    reported = figures(measurement, check)
    assert [figure.command for figure in reported] == [COMMAND] * 3
    assert all(figure.ratio is not None for figure in reported)
    assert reported[1].met is True  # the cap
