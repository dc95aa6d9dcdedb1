"""`bench`: the benchmarks against the naive pattern measured in the same run (`make bench` writes BENCHMARKS.md)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    from agent_jobs_bench.harness import Runner


@dataclass(frozen=True)
class BenchRun:
    """How `bench` loads a benchmark's `run` (a test passes its own); without one, each runs in a fresh interpreter."""

    loader: Callable[[str], Runner]


def bench(
    ctx: typer.Context,
    names: Annotated[
        list[str] | None, typer.Argument(metavar="NAME", help="Benchmarks to run, like --only (default: all).")
    ] = None,
    quick: Annotated[bool, typer.Option("--quick", help="Smaller runs (tests, CI smoke).")] = False,
    only: Annotated[list[str] | None, typer.Option("--only", metavar="NAME", help="Run only this benchmark.")] = None,
    output: Annotated[
        Path | None, typer.Option("--output", help="Write the report there (e.g. BENCHMARKS.md).")
    ] = None,
    figures_json: Annotated[Path | None, typer.Option("--figures-json", hidden=True)] = None,
) -> None:
    """Run the benchmarks, print their figures and write them as a Markdown report with the machine they ran on.
    `--only a b` and `--only a --only b` both run a and b."""
    from agent_jobs_bench.harness import BENCHMARKS, load, run_benchmarks

    chosen = [*(only or []), *(names or [])]
    unknown = [name for name in chosen if name not in BENCHMARKS]
    if unknown:
        raise typer.BadParameter(f"no benchmark {', '.join(unknown)}; choose from {', '.join(BENCHMARKS)}")
    run = ctx.find_object(BenchRun)
    status = run_benchmarks(
        chosen, quick=quick, output=output, figures_json=figures_json, loader=load if run is None else run.loader
    )
    if status:
        raise typer.Exit(status)


bench_app = typer.Typer(name="python -m agent_jobs_bench", add_completion=False, pretty_exceptions_enable=False)
bench_app.command()(bench)
