"""The benchmark harness behind `agent-jobs bench` (and `python -m agent_jobs_bench`, `make bench`): run the benchmarks,
print their figures and write them as a Markdown report with the machine they ran on.

Each benchmark is a module of this package with `run(quick: bool = False) -> list[Figure]`. A module that is missing
or fails is reported as an error line in its section (the others still run) and the exit status is 1.
"""

from __future__ import annotations

import datetime
import importlib
import importlib.util
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from agent_jobs_bench.figures import Comparison, Figure, Goal

REPO = Path(__file__).resolve().parent.parent
# Like sam local: the layer's package (as at /opt/python) and the worker's code (as at /var/task) are importable.
for _folder in (REPO / "functions" / "job_worker", REPO / "layers" / "shared"):
    if str(_folder) not in sys.path:
        sys.path.insert(0, str(_folder))

# The benchmark modules, in report order, with their section titles (used when a module cannot say it itself).
BENCHMARKS: dict[str, str] = {
    "calls": "Calls and capacity per job",
    "batch_enqueue": "Batch enqueue",
    "group_parallel": "Group-parallel worker",
    "cold_start": "Cold start",
    "git_round_trips": "Git round trips per apply_patch",
    "workspace_growth": "apply_patch as a workspace grows",
    "cold_first_job": "First job on a cold cache",
    "end_to_end": "End to end, local",
    "plan": "Capacity and cost plan",
}
DEFAULT_OUTPUT = "BENCHMARKS.md"


@dataclass
class Section:
    name: str
    title: str
    figures: list[Figure] = field(default_factory=list)
    error: str | None = None
    seconds: float = 0.0


Runner = Callable[[bool], list[Figure]]


def load_in_process(name: str) -> Runner:
    """The `run` function of benchmark module `name` (ImportError when the module is not there)."""
    module = importlib.import_module(f"agent_jobs_bench.{name}")
    runner: Runner = module.run
    return runner


def load(name: str) -> Runner:
    """`run` of benchmark module `name`, run in a fresh interpreter: what one benchmark imports and sets (the handler
    modules, their Powertools objects built from the environment of that moment, environment variables) cannot leak
    into the next, as it cannot between Lambda execution environments."""
    if importlib.util.find_spec(f"agent_jobs_bench.{name}") is None:
        raise ModuleNotFoundError(f"No module named 'agent_jobs_bench.{name}'")

    def run_isolated(quick: bool) -> list[Figure]:
        with tempfile.TemporaryDirectory() as folder:
            output = Path(folder) / "figures.json"
            command = [sys.executable, "-m", "agent_jobs_bench", "--figures-json", str(output), "--only", name]
            completed = subprocess.run([*command, *(["--quick"] if quick else [])], cwd=REPO, check=False)
            if not output.exists():
                raise RuntimeError(f"{' '.join(command)} ended with status {completed.returncode} and no figures")
            return [figure_from_json(document) for document in json.loads(output.read_text())]

    return run_isolated


def figure_from_json(document: dict[str, Any]) -> Figure:
    goal = document.get("goal")
    if goal is not None:
        goal = Goal(value=goal["value"], comparison=Comparison(goal["comparison"]), text=goal["text"])
    return Figure(**{**document, "goal": goal})


def run_section(name: str, quick: bool, loader: Callable[[str], Runner] = load) -> Section:
    """One benchmark run; any failure becomes the section's error line instead of stopping the others."""
    section = Section(name=name, title=BENCHMARKS.get(name, name))
    started = time.monotonic()
    try:
        runner = loader(name)
    except ModuleNotFoundError as missing:
        section.error = f"benchmark module agent_jobs_bench.{name} is missing ({missing})"
        return section
    except Exception as error:
        section.error = f"benchmark module agent_jobs_bench.{name} failed to import: {error!r}"
        return section
    try:
        section.figures = list(runner(quick))
    except Exception as error:
        traceback.print_exc(file=sys.stderr)
        section.error = f"benchmark {name} failed: {error!r}"
    section.seconds = time.monotonic() - started
    if section.figures:
        section.title = section.figures[0].benchmark
    return section


# ---- the machine ---------------------------------------------------------------------------------------------------


def cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    try:
        for line in cpuinfo.read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("model name", "Model", "Hardware"):
                return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def machine() -> dict[str, str]:
    return {
        "CPU": f"{os.cpu_count()} x {cpu_model()}",
        "Python": f"{platform.python_version()} ({platform.python_implementation()})",
        "OS": platform.platform(),
        "Date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
    }


# ---- the report ----------------------------------------------------------------------------------------------------


def _number(value: float) -> str:
    if value == int(value) and abs(value) < 1e15:
        return f"{int(value)}"
    return f"{value:.3g}" if abs(value) < 1000 else f"{value:,.0f}"


def _met(figure: Figure) -> str:
    met = figure.met
    return "" if met is None else ("met" if met else "**not met**")


def _goal(figure: Figure) -> str:
    if figure.goal is None:
        return ""
    return figure.goal.text + (" (ratio)" if figure.goal_on == "ratio" else "")


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render(sections: Sequence[Section], *, quick: bool, host: dict[str, str]) -> str:
    mode = "quick (smaller runs)" if quick else "full"
    lines = [
        "# Benchmarks",
        "",
        "Agent Jobs measured against the naive pattern (GetItem + PutItem + SendMessage per enqueued job; GetItem +"
        " PutItem + PutItem per record in a sequential loop over the batch), the baseline measured in the same run on"
        " the same local emulator. Ratio = value / baseline. Written by `make bench`"
        f" (`.venv/bin/python -m agent_jobs_bench --output {DEFAULT_OUTPUT}`); this run: {mode}.",
        "",
        "## Machine",
        "",
        *(f"- {key}: {value}" for key, value in host.items()),
        "",
    ]
    goals = [(s, f) for s in sections for f in s.figures if f.goal is not None]
    if goals:
        lines += ["## Goals", "", "| Section | Figure | Goal | Value | Met |", "|---|---|---|---|---|"]
        for section, figure in goals:
            measured = figure.ratio if figure.goal_on == "ratio" else figure.value
            shown = "" if measured is None else _number(measured)
            lines.append(
                f"| {_cell(section.title)} | {_cell(figure.name)} | {_cell(_goal(figure))} | {shown} | {_met(figure)} |"
            )
        lines.append("")
    for section in sections:
        lines += [f"## {section.title}", ""]
        if section.error is not None:
            lines += [f"ERROR: {_cell(section.error)}", ""]
        if section.figures:
            lines += [
                "| Figure | Value | Baseline | Ratio | Goal | Met | Command |",
                "|---|---|---|---|---|---|---|",
            ]
            for figure in section.figures:
                baseline = "" if figure.baseline is None else f"{_number(figure.baseline)} {figure.unit}"
                ratio = "" if figure.ratio is None else f"{figure.ratio:.2f}x"
                lines.append(
                    f"| {_cell(figure.name)} | {_number(figure.value)} {figure.unit} | {baseline} | {ratio}"
                    f" | {_cell(_goal(figure))} | {_met(figure)} | `{figure.command}` |"
                )
            lines.append("")
            notes = [f for f in section.figures if f.note]
            if notes:
                lines += [f"- {_cell(f.name)}: {_cell(f.note)}" for f in notes]
                lines.append("")
        if section.figures:
            lines += [f"Measured in {section.seconds:.1f} s.", ""]
    return "\n".join(lines)


def summary_line(section: Section) -> str:
    if section.error is not None and not section.figures:
        return f"{section.name}: ERROR {section.error}"
    parts = []
    for figure in section.figures:
        baseline = "" if figure.baseline is None else f" (baseline {_number(figure.baseline)})"
        met = f" [{_met(figure).strip('*')}]" if figure.met is not None else ""
        parts.append(f"  {figure.name}: {_number(figure.value)} {figure.unit}{baseline}{met}")
    error = [f"  ERROR {section.error}"] if section.error else []
    return "\n".join([f"{section.title} ({section.seconds:.1f} s)", *parts, *error])


def run_benchmarks(
    names: Sequence[str],
    *,
    quick: bool = False,
    output: Path | None = None,
    figures_json: Path | None = None,
    loader: Callable[[str], Runner] = load,
) -> int:
    """Run the named benchmarks (all when `names` is empty) in report order; the exit status (1 when one failed).
    With `figures_json`, run the one named benchmark in this process and write its figures there (for `load`)."""
    chosen = [name for name in BENCHMARKS if not names or name in names]
    if figures_json is not None:
        (name,) = chosen
        figures = load_in_process(name)(quick)
        figures_json.write_text(json.dumps([asdict(figure) for figure in figures]))
        return 0
    sections = []
    for name in chosen:
        print(f"running {name} ...", file=sys.stderr, flush=True)
        section = run_section(name, quick, loader)
        print(summary_line(section), flush=True)
        sections.append(section)
    if output is not None:
        output.write_text(render(sections, quick=quick, host=machine()))
        print(f"wrote {output}", file=sys.stderr)
    return 1 if any(section.error for section in sections) else 0
