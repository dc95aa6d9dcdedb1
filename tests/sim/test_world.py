"""The deterministic simulation: the product's code on simulated SQS, DynamoDB and git under a seeded scheduler with
faults at every step. Seeds pass; a seed replays exactly (in this process and through the replay command); each
planted bug of the naive pattern is found, and its failing seed replays to the same violation."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from agent_jobs_sim.planted import PLANTS
from agent_jobs_sim.runner import replay_command, run
from agent_jobs_sim.world import SimConfig, simulate

ROOT = Path(__file__).resolve().parents[2]
# Seeds `make test` runs with no planted bug; `make sim SEEDS=N` runs any number.
SEEDS = 300
# The planted bugs the search below finds, and how many seeds it may try for each (`make sim PLANT=...` searches
# further, as it did for FOUND_LATER).
FOUND_WITHIN = 1_000
FINDABLE = [
    "naive-claim",
    "get-then-put",
    "past-failure",
    "trusting-drain",
    "no-predecessor-check",
    "deferral-as-failure",
    "resend-moves-place",
    "shallow-as-absent",
    "tips-only-fetch",
    "partial-index",
]


def test_seeds_pass_with_faults_at_every_step():
    report = run(0, SEEDS, SimConfig(), processes=1)
    print(f"{report.seeds} seeds, {report.seeds_per_second:.1f} seeds/s, faults {dict(report.faults)}")
    assert report.seeds == SEEDS
    assert [(r.seed, r.violation) for r in report.failures] == []
    # Every kind of fault was injected somewhere in these seeds.
    kinds = {
        "crash",
        "throttle",
        "server_error",
        "lost_answer",
        "stall",
        "lost_delete",
        "outage",
        "poison",
        "failing_invocation",
        "early_visibility",
        "short_visibility",
        "slow_job",
        "unconfirmed_send",
        "careless_soon",
        "careless_late",
        "careless_never",
        "other_writers",
        "cache_lost",
        "lost_push",
        "deepen_error",
    }
    assert kinds <= set(report.faults)
    # Careless agents: a job put off after a failed submission is answered, on its retry, with a place before jobs
    # answered meanwhile (its first send went through), and a put-off job's message is dead-lettered, in some seeds.
    print(f"careless agents in {report.careless_seeds} seeds: {dict(report.careless)}")
    assert report.careless["seeds_out_of_order"] > 0
    assert report.careless["seeds_dead_lettered"] > 0
    # With a share of one invocation per tenant, two tenants and three pollers, the share bites: records are deferred
    # (their jobs untouched, their groups handed back in order, checked by the oracle) and every job still settles.
    print(f"deferred {report.deferred} records in {report.seeds_deferring} seeds")
    assert report.seeds_deferring > SEEDS // 2
    # Jobs retried after their commit, with other writers' commits above it, on caches that held the tips alone: the
    # product's lookup deepened them and found the job's commit below the tips.
    print(f"git caches: {dict(report.git)} ({report.git_seeds} seeds with the remote's faults)")
    assert report.git["found_after_deepening"] > 0


def test_a_seed_replays_exactly_in_this_process():
    first, second = simulate(7), simulate(7)
    assert first.steps > 100
    assert (first.trace, first.violation, first.steps, first.faults) == (
        second.trace,
        second.violation,
        second.steps,
        second.faults,
    )
    assert simulate(8).trace != first.trace


def _replay(seed: int, plant: str | None, *, tenant_share: int = SimConfig.tenant_share) -> str:
    words = replay_command(seed, SimConfig(plant=plant, tenant_share=tenant_share)).split()
    assert words[:3] == ["python", "-m", "agent_jobs_sim"]
    answer = subprocess.run(
        [sys.executable, "-m", "agent_jobs_sim", *words[3:]],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONHASHSEED": "random"},  # the command fixes hashing itself
        check=False,
    )
    return answer.stdout


# The seeds below were found before the world ran with a tenant share; with one each seed's schedule is another (its
# invocations query the running index and defer), so they replay with the share off, as they were found.
UNSHARED = 0

# The planted bugs found with the share off, whose first failing seed with it lies hundreds of seeds on, more than
# `make test` should spend searching: that seed (`make sim PLANT=... SHARE=0 SEEDS=2000` stops there), checked as the
# search checks the others.
FOUND_LATER = {"lost-claims-as-failures": 94, "unfenced-complete": 464}


@pytest.mark.parametrize("plant", FINDABLE)
def test_a_planted_bug_is_found_and_its_seed_replays_to_the_same_violation(plant):
    report = run(0, FOUND_WITHIN, SimConfig(plant=plant), processes=1, stop_at_first=True)
    assert report.failures, f"{plant}: no failing seed in {report.seeds} seeds"
    failing = report.failures[0]
    print(f"{plant}: seed {failing.seed} after {report.seeds} seeds: {failing.violation}")
    first, second = _replay(failing.seed, plant), _replay(failing.seed, plant)
    assert first == second
    assert f"seed {failing.seed}: {failing.violation}" in first
    assert f"trace {failing.trace}" in first
    # The bug fails the seed, not the world: without it the same seed passes.
    assert simulate(failing.seed).passed


@pytest.mark.parametrize(("plant", "seed"), FOUND_LATER.items())
def test_a_planted_bug_found_later_fails_its_seed_which_replays_to_the_same_violation(plant, seed):
    failing = simulate(seed, SimConfig(plant=plant, tenant_share=UNSHARED))
    assert failing.violation is not None, f"{plant}: seed {seed} passed"
    first, second = _replay(seed, plant, tenant_share=UNSHARED), _replay(seed, plant, tenant_share=UNSHARED)
    assert first == second
    assert f"seed {seed}: {failing.violation}" in first
    assert f"trace {failing.trace}" in first
    assert simulate(seed, SimConfig(tenant_share=UNSHARED)).passed


def test_parking_at_the_last_delivery_is_found_once_the_predecessor_check_is_out_too():
    # Two defences stand between a job dead-lettered after a worker claimed it and the jobs behind it: parking it on
    # its last delivery, and the check for unsettled jobs ahead of each claimed one. Taking out the parking alone
    # breaks nothing (the check catches the job behind), so seed 72 shows the parking's own part: with both out
    # ws-4-job-002 takes effect while ws-4-job-001, accepted before it, is left IN_FLIGHT and never takes effect; with
    # either one in, the order holds.
    seed, plant = 72, "no-last-delivery-park-unguarded"
    broken = simulate(seed, SimConfig(plant=plant, tenant_share=UNSHARED))
    assert broken.violation is not None
    assert "ws-4-job-001, accepted before it, is IN_FLIGHT and never took effect" in broken.violation
    first, second = _replay(seed, plant, tenant_share=UNSHARED), _replay(seed, plant, tenant_share=UNSHARED)
    assert first == second
    assert f"trace {broken.trace}" in first
    assert simulate(seed, SimConfig(plant="no-predecessor-check", tenant_share=UNSHARED)).passed
    assert simulate(seed, SimConfig(plant="no-last-delivery-park", tenant_share=UNSHARED)).passed


def test_every_planted_bug_is_described():
    assert set(FINDABLE) | set(FOUND_LATER) <= set(PLANTS)
    assert all(plant.description.startswith("(") for plant in PLANTS.values())


@pytest.mark.parametrize("seed", [62])
def test_seeds_that_found_a_real_bug_fail_with_it_and_pass_without(seed):
    # A resume's drain ran a parked job before a job accepted ahead of it that the queue had dead-lettered while the
    # workspace was halted. With the drain's check taken out again these seeds break the order; with it they pass
    # (tests/integration/test_resume_worker.py keeps the same case without the simulation).
    broken = simulate(seed, SimConfig(plant="drain-past-missing"))
    assert broken.violation is not None
    assert "never took effect" in broken.violation
    result = simulate(seed)
    assert result.passed, result.violation


@pytest.mark.parametrize("seed", [827])
def test_the_seed_that_found_a_redrive_race_passes(seed):
    # An operator's redrive parked a dead-lettered job and halted its workspace just after a worker claimed the job
    # behind it (the workspace still ACTIVE) and just before that worker looked for unsettled jobs ahead: the parked
    # job had left the pending index, so the job behind it ran first. A halting park now keeps the job in the index.
    # Since a job's place is decided once the schedules differ and no seed searched reaches that race again with the
    # index left out (`redriven-unlisted`: seeds 0-3999 without a share, 0-1999 with one); the seed stays a seed.
    result = simulate(seed, SimConfig(tenant_share=UNSHARED))
    assert result.passed, result.violation


def test_a_seed_whose_lease_was_taken_over_by_a_clock_ahead_before_its_holder_ran_passes():
    # Seed 15667: an environment whose clock was 8.7 s ahead took a job's lease over, its expiry passed by its own
    # clock, in the 11 s the holder (its clock 2.6 s behind) had left, between the holder's claim and its run. Clock
    # skew, which no lease survives: the oracle once reported the holder's run as one without a lease.
    result = simulate(15667)
    assert result.passed, result.violation


def test_without_a_share_nothing_is_deferred():
    # The same seed with the share off runs every record where it lands; the seeds above defer with it on.
    assert simulate(2).counts.get("deferred_records", 0) > 0
    result = simulate(2, SimConfig(tenant_share=0))
    assert result.passed, result.violation
    assert result.counts.get("deferred_records", 0) == 0
    assert replay_command(2, SimConfig(tenant_share=0)).endswith("--share 0")
