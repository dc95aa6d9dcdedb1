"""What a job's result says, for people: a run_tests result as passed or failed (with the counts its output's summary
line gives) and its output tail as text, an apply_patch result as its commit, an open_pr result as its pull request.

A test's output is the tenant's code speaking: it is shown with its control characters written out (`\\x1b`), never
sent to the terminal, so that it cannot move the cursor, retitle the window or hide lines.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any, Final

from rich.text import Text

# pytest's summary line ("== 1 failed, 12 passed in 0.31s ==", or without the rules under -q).
_PYTEST_SUMMARY: Final = re.compile(r"^=*\s*((?:\d+ [a-z]+(?:, )?)+) in [\d.]+s(?: \([^)]*\))?\s*=*$")
_PYTEST_COUNT: Final = re.compile(r"(\d+) ([a-z]+)")
_PYTEST_NAMES: Final = {"passed": "passed", "failed": "failed", "error": "errors", "errors": "errors"}
# unittest's "Ran 13 tests in 0.002s" and its verdict "OK", "OK (skipped=1)" or "FAILED (failures=1, errors=2)".
_UNITTEST_RAN: Final = re.compile(r"^Ran (\d+) tests? in [\d.]+s$")
_UNITTEST_VERDICT: Final = re.compile(r"^(OK|FAILED)(?: \((.*)\))?$")
_OUTCOME_WORDS: Final = {"timed_out": "timed out"}
_SHORT_SHA: Final = 7


def printable(text: str) -> str:
    """`text` with every control character but newline and tab written out as an escape (`\\x1b`)."""
    return "".join(
        char if char in "\n\t" or char.isprintable() else char.encode("unicode_escape").decode() for char in text
    )


def suite_counts(output_tail: str) -> dict[str, int] | None:
    """passed, failed and errors (and skipped when said) from the last summary line pytest or unittest printed in
    the output, or None when it has none."""
    lines = [line.strip() for line in output_tail.splitlines() if line.strip()]
    for index in range(len(lines) - 1, -1, -1):
        line = lines[index]
        pytest_line = _PYTEST_SUMMARY.match(line)
        if pytest_line:
            counts = {"passed": 0, "failed": 0, "errors": 0}
            for number, name in _PYTEST_COUNT.findall(pytest_line.group(1)):
                key = _PYTEST_NAMES.get(name, name)
                counts[key] = counts.get(key, 0) + int(number)
            return counts
        ran = _UNITTEST_RAN.match(line)
        if ran:
            return _unittest_counts(int(ran.group(1)), lines[index + 1 :])
    return None


def _unittest_counts(ran: int, after: list[str]) -> dict[str, int] | None:
    verdict = next((match for line in after if (match := _UNITTEST_VERDICT.match(line))), None)
    if verdict is None:
        return None
    said = dict(part.strip().split("=", 1) for part in (verdict.group(2) or "").split(",") if "=" in part)
    failed, errors, skipped = (int(said.get(name, 0)) for name in ("failures", "errors", "skipped"))
    others = sum(int(said.get(name, 0)) for name in ("expected failures", "unexpected successes"))
    counts = {"passed": ran - failed - errors - skipped - others, "failed": failed, "errors": errors}
    return {**counts, "skipped": skipped} if skipped else counts


def counts_text(counts: dict[str, int]) -> str:
    """`1 failed, 12 passed` (what pytest would say; none of a kind is left out, passed always said)."""
    order = ("failed", "errors", "passed", "skipped")
    named = [f"{counts[name]} {name}" for name in order if counts.get(name) or name == "passed"]
    return ", ".join(named + [f"{number} {name}" for name, number in counts.items() if name not in order and number])


def is_run_tests_result(result: Any) -> bool:
    return isinstance(result, dict) and "outcome" in result and "suite" in result


def result_cell(job: dict[str, Any]) -> Text:
    """One line for the timeline: a failed job's error, else what its result says."""
    error, result = job.get("error"), job.get("result")
    if error and job.get("status") in ("DEAD", "REJECTED", "FAILED"):
        return _line(str(error), "red")
    if not isinstance(result, dict) or not result:
        return Text("")
    if is_run_tests_result(result):
        outcome = str(result.get("outcome"))
        counts = suite_counts(str(result.get("outputTail") or ""))
        word = _OUTCOME_WORDS.get(outcome, outcome)
        if counts is not None:
            total = counts["passed"] + counts["failed"] + counts["errors"]
            word += f" {counts['passed']}/{total}"
        return _line(
            word, "green" if outcome == "passed" else "red" if outcome in _OUTCOME_WORDS or outcome == "failed" else ""
        )
    if "commit" in result:
        return _line(
            str(result["commit"])[:_SHORT_SHA] + (" (already applied)" if result.get("alreadyApplied") else "")
        )
    if "number" in result:
        return _line(f"PR #{result['number']}" + (" (already open)" if result.get("alreadyOpen") else ""))
    return _line(json.dumps(result, sort_keys=True))


def _line(text: str, style: str = "") -> Text:
    # One line, cut short with an ellipsis when the column is narrower: a timeline row stays one row.
    first = printable(text.splitlines()[0] if text.strip() else text)
    return Text(first, style=style, no_wrap=True, overflow="ellipsis")


def result_fields(result: Any) -> list[tuple[str, Any]]:
    """The job view's rows for its result (the output tail apart: `output_text`)."""
    if not isinstance(result, dict) or not result:
        return []
    if is_run_tests_result(result):
        outcome = str(result.get("outcome"))
        verdict = _OUTCOME_WORDS.get(outcome, outcome)
        if result.get("exitCode") is not None and outcome != "passed":
            verdict += f" (exit code {result['exitCode']})"
        counts = suite_counts(str(result.get("outputTail") or ""))
        rows: list[tuple[str, Any]] = [
            ("tests", Text(verdict, style="green" if outcome == "passed" else "red")),
            ("counts", counts_text(counts) if counts else None),
            ("suite", result.get("suite")),
            ("commit", result.get("commit")),
            ("duration", f"{result['durationSeconds']} s" if result.get("durationSeconds") is not None else None),
            ("reused", "yes: the result stored for this commit" if result.get("reused") else None),
        ]
        shown = {"outcome", "exitCode", "suite", "commit", "durationSeconds", "reused", "outputTail", "truncated"}
        return rows + _other_fields(result, shown)
    if "commit" in result:
        rows = [("commit", result["commit"]), ("parent", result.get("parent"))]
        rows.append(("already applied", "yes" if result.get("alreadyApplied") else None))
        return rows + _other_fields(result, {"commit", "parent", "alreadyApplied"})
    if "number" in result:
        rows = [("pull request", f"#{result['number']} {result.get('url') or ''}".strip())]
        rows.append(("already open", "yes" if result.get("alreadyOpen") else None))
        return rows + _other_fields(result, {"number", "url", "alreadyOpen"})
    return _other_fields(result, set())


def _other_fields(result: dict[str, Any], shown: Iterable[str]) -> list[tuple[str, Any]]:
    left = {name: value for name, value in result.items() if name not in set(shown)}
    return [(name, printable(value if isinstance(value, str) else json.dumps(value))) for name, value in left.items()]


def output_text(result: Any) -> Text | None:
    """A run_tests result's output tail as text (its control characters written out), with a heading; None if none."""
    if not is_run_tests_result(result) or not result.get("outputTail"):
        return None
    heading = "output (its last lines)" if result.get("truncated") else "output"
    text = Text(f"{heading}:\n", style="bold")
    text.append(printable(str(result["outputTail"]).rstrip("\n")))
    return text
