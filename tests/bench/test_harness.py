"""`python -m agent_jobs_bench`: every benchmark gets its section in BENCHMARKS.md, with its figures or its error."""

from __future__ import annotations

import importlib
import importlib.util
from pathlib import Path

from agent_jobs_bench.__main__ import main
from agent_jobs_bench.figures import Comparison, Figure, Goal
from agent_jobs_bench.harness import BENCHMARKS, Runner


def _sections(report: str) -> dict[str, str]:
    """Section title -> its text."""
    parts = report.split("\n## ")[1:]
    return {part.split("\n", 1)[0]: part for part in parts}


def test_harness_reports_figures_goals_and_errors(tmp_path: Path) -> None:
    # Given one benchmark with figures, one missing and one that fails
    def loader(name: str) -> Runner:
        if name == "calls":
            return lambda quick: [
                Figure(
                    "Calls",
                    "calls per job",
                    2,
                    "calls",
                    "cmd --only calls",
                    baseline=4,
                    goal=Goal(2, Comparison.AT_MOST, "<= 2 calls"),
                ),
                Figure(
                    "Calls",
                    "WCU per job",
                    5,
                    "WCU",
                    "cmd --only calls",
                    baseline=2,
                    goal=Goal(2, Comparison.AT_MOST, "<= 2 WCU"),
                    note="transactions cost 2x",
                ),
            ]
        if name == "plan":
            raise ModuleNotFoundError(f"No module named 'agent_jobs_bench.{name}'")

        def fail(quick: bool) -> list[Figure]:
            raise RuntimeError("emulator went away")

        return fail

    output = tmp_path / "BENCHMARKS.md"
    # When the harness runs all of them
    status = main(["--quick", "--output", str(output)], loader=loader)
    # Then the report has the machine, the goals, a table for the figures and an error line for each failure
    report = output.read_text()
    assert status == 1
    sections = _sections(report)
    assert {"Machine", "Goals", "Calls"} <= sections.keys()
    for line in ("- CPU: ", "- Python: ", "- OS: ", "- Date: "):
        assert line in sections["Machine"]
    assert "| calls per job | 2 calls | 4 calls | 0.50x | <= 2 calls | met | `cmd --only calls` |" in report
    assert "| WCU per job | 5 WCU | 2 WCU | 2.50x | <= 2 WCU | **not met** | `cmd --only calls` |" in report
    assert "- WCU per job: transactions cost 2x" in sections["Calls"]
    assert "ERROR: benchmark module agent_jobs_bench.plan is missing" in sections[BENCHMARKS["plan"]]
    for name in ("batch_enqueue", "group_parallel", "cold_start", "end_to_end"):
        assert "ERROR: benchmark " + name + " failed: RuntimeError('emulator went away')" in sections[BENCHMARKS[name]]


def test_harness_only_runs_the_named_benchmarks(tmp_path: Path) -> None:
    ran: list[str] = []

    def loader(name: str) -> Runner:
        ran.append(name)
        return lambda quick: []

    assert main(["--quick", "--only", "cold_start", "plan"], loader=loader) == 0
    assert ran == ["cold_start", "plan"]


def test_every_benchmark_has_its_module_with_a_run_function() -> None:
    for name in BENCHMARKS:
        assert importlib.util.find_spec(f"agent_jobs_bench.{name}") is not None, name
        assert callable(importlib.import_module(f"agent_jobs_bench.{name}").run), name


def test_harness_quick_run_writes_the_sections_of_real_benchmarks(tmp_path: Path) -> None:
    # Given real benchmark modules, each run by the harness in a fresh interpreter as `make bench` runs them (the others
    # have their own quick runs in tests/bench; the cheap ones suffice to check the harness end to end)
    output = tmp_path / "BENCHMARKS.md"
    names = ["calls", "batch_enqueue", "end_to_end"]
    assert main(["--quick", "--only", *names, "--output", str(output)]) == 0
    sections = _sections(output.read_text())
    for name in names:
        # A module names its own section; its figures' commands name the module.
        section = next((text for text in sections.values() if f"--only {name}`" in text), "")
        assert "| Figure | Value | Baseline | Ratio | Goal | Met | Command |" in section, name
        assert "ERROR" not in section, section
    calls = sections["Calls and capacity per job"]
    # (2 jobs in one batch: the tenant share's Query and the read of the tenant's own share, once each, are half a call
    # per job here; a tenth with the full run's 10)
    assert "| DynamoDB calls per job, happy path (worker) | 5 calls | 3 calls |" in calls
    assert "| DynamoDB calls per job, duplicate delivery | 1.5 calls | 1 calls |" in calls
