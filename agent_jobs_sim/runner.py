"""Many seeds on every core, the figures, and the replay command of each failing seed."""

from __future__ import annotations

import argparse
import collections
import multiprocessing
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from agent_jobs_sim import world
from agent_jobs_sim.planted import PLANTS, swapped
from agent_jobs_sim.world import SimConfig, SimResult, simulate

# Seeds a worker process takes at a time: few enough that --stop-at-first stops soon.
CHUNK = 8
# What the workers' git caches did (`agent_jobs_sim.remote`), summed over the seeds.
GIT_COUNTS = ("cold_fetches", "deepened", "found_after_deepening")


@dataclass
class Report:
    seeds: int = 0
    seconds: float = 0.0
    processes: int = 1
    steps: int = 0
    faults: collections.Counter[str] = field(default_factory=collections.Counter)
    # Records handed back over their tenant's share, and the seeds that handed any back.
    deferred: int = 0
    seeds_deferring: int = 0
    # Seeds whose agents put a failed job off or gave it up, and what became of those jobs' answers and messages.
    careless_seeds: int = 0
    careless: collections.Counter[str] = field(default_factory=collections.Counter)
    # Seeds with the git remote's faults (other writers, lost caches), and what the caches did in all seeds.
    git_seeds: int = 0
    git: collections.Counter[str] = field(default_factory=collections.Counter)
    failures: list[SimResult] = field(default_factory=list)

    @property
    def seeds_per_second(self) -> float:
        return self.seeds / self.seconds if self.seconds else 0.0

    def add(self, result: SimResult) -> None:
        self.seeds += 1
        self.steps += result.steps
        self.faults.update(result.faults)
        deferred = result.counts.get("deferred_records", 0)
        self.deferred += deferred
        self.seeds_deferring += 1 if deferred else 0
        careless = {kind: n for kind, n in result.faults.items() if kind.startswith("careless_")}
        if careless:
            self.careless_seeds += 1
            self.careless.update(careless)
            self.careless.update({"seeds_out_of_order": 1} if result.counts.get("answered_out_of_order") else {})
            self.careless.update({"seeds_dead_lettered": 1} if careless.get("careless_dead_lettered") else {})
        if "cache_lost" in result.faults or "other_writers" in result.faults:
            self.git_seeds += 1
        self.git.update({kind: result.counts[kind] for kind in GIT_COUNTS if kind in result.counts})
        if not result.passed:
            self.failures.append(result)


def replay_command(seed: int, config: SimConfig) -> str:
    words = ["python -m agent_jobs_sim", f"--replay {seed}"]
    if config.jobs != SimConfig.jobs:
        words.append(f"--jobs {config.jobs}")
    if config.workspaces != SimConfig.workspaces:
        words.append(f"--workspaces {config.workspaces}")
    if config.tenant_share != SimConfig.tenant_share:
        words.append(f"--share {config.tenant_share}")
    if config.plant:
        words.append(f"--plant {config.plant}")
    return " ".join(words)


def _one(job: tuple[int, SimConfig]) -> SimResult:
    seed, config = job
    return simulate(seed, config)


def results(first: int, count: int, config: SimConfig, processes: int) -> Iterator[SimResult]:
    """Each seed's result, in the order they finish."""
    jobs = ((seed, config) for seed in range(first, first + count))
    if processes <= 1:
        yield from map(_one, jobs)
        return
    # The worker processes keep their worlds' git caches in one folder of this process's: one ended early (a run that
    # stops at its first failing seed) cannot remove its own.
    with (
        tempfile.TemporaryDirectory(prefix="agent-jobs-sim-", dir=world.CACHE_DIR) as folder,
        swapped(world, "CACHE_DIR", folder),
        multiprocessing.get_context("fork").Pool(processes) as pool,
    ):
        yield from pool.imap_unordered(_one, jobs, chunksize=CHUNK)


def run(first: int, count: int, config: SimConfig, *, processes: int, stop_at_first: bool = False) -> Report:
    report = Report(processes=processes)
    started = time.perf_counter()
    for result in results(first, count, config, processes):
        report.add(result)
        if stop_at_first and report.failures:
            break
    report.seconds = time.perf_counter() - started
    return report


def print_report(report: Report, config: SimConfig) -> None:
    per_core = report.seeds_per_second / max(1, report.processes)
    print(
        f"{report.seeds} seeds in {report.seconds:.1f} s on {report.processes} processes: "
        f"{report.seeds_per_second:.1f} seeds/s, {per_core:.1f} seeds/s per core "
        f"({config.jobs} jobs over {config.workspaces} workspaces per seed, {report.steps // max(1, report.seeds)} "
        "steps per seed)"
    )
    print("faults injected: " + ", ".join(f"{kind} {n}" for kind, n in sorted(report.faults.items())))
    print(
        f"tenant share {config.tenant_share}: deferred {report.deferred} records, in {report.seeds_deferring} of "
        f"{report.seeds} seeds"
    )
    careless = report.careless
    print(
        f"careless agents in {report.careless_seeds} seeds: jobs put off {careless['careless_soon']} times within the "
        f"deduplication window and {careless['careless_late']} after it, {careless['careless_never']} given up; "
        f"answers out of submission order in {careless['seeds_out_of_order']} seeds, a put-off job's message "
        f"dead-lettered in {careless['seeds_dead_lettered']}"
    )
    git = report.git
    print(
        f"git caches: {git['cold_fetches']} cold fetches, {git['deepened']} deepenings, {git['found_after_deepening']} "
        f"job commits found below the tips after deepening; other writers or lost caches in {report.git_seeds} seeds"
    )
    if not report.failures:
        print("every seed passed")
        return
    print(f"{len(report.failures)} failing seeds:")
    for result in sorted(report.failures, key=lambda r: r.seed)[:20]:
        print(f"  seed {result.seed}: {result.violation}")
        print(f"    replay: {replay_command(result.seed, config)}")


def main(args: argparse.Namespace) -> int:
    if args.list_plants:
        for name, plant in PLANTS.items():
            print(f"{name:24} {plant.description}")
        return 0
    if args.plant is not None and args.plant not in PLANTS:
        print(f"unknown planted bug {args.plant!r}: one of {', '.join(PLANTS)}")
        return 2
    config = SimConfig(jobs=args.jobs, workspaces=args.workspaces, tenant_share=args.share, plant=args.plant)
    if args.replay is not None:
        result = simulate(args.replay, config)
        print(f"seed {result.seed}: {'passed' if result.passed else result.violation}")
        print(f"trace {result.trace}: {result.steps} steps, {result.virtual_seconds:.0f} virtual seconds")
        print("faults: " + ", ".join(f"{kind} {n}" for kind, n in sorted(result.faults.items())))
        print(f"tenant share {config.tenant_share}: deferred {result.counts.get('deferred_records', 0)} records")
        return 0 if result.passed else 1
    report = run(args.first, args.seeds, config, processes=args.processes, stop_at_first=args.stop_at_first)
    print_report(report, config)
    return 0 if not report.failures else 1
