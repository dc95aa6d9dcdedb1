"""What every benchmark reports: figures, each a measurement beside the baseline measured in the same run."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Comparison(StrEnum):
    """How a figure meets its goal: at most the goal (costs, ratios of times) or at least it (speed-ups)."""

    AT_MOST = "<="
    AT_LEAST = ">="


@dataclass(frozen=True)
class Goal:
    value: float
    comparison: Comparison
    text: str  # the goal as stated, e.g. "<= 2 DynamoDB calls per job"

    def met_by(self, measured: float) -> bool:
        if self.comparison is Comparison.AT_MOST:
            return measured <= self.value
        return measured >= self.value


@dataclass(frozen=True)
class Figure:
    """One measured figure. `baseline` is the naive pattern's figure measured in the same run (None where there is no
    baseline, e.g. a count that is a goal by itself); `ratio` is value / baseline unless the benchmark defines it
    otherwise (say so in `note`); `goal` is checked against `goal_on` ("value" or "ratio")."""

    benchmark: str  # section, e.g. "Calls and capacity per job"
    name: str  # e.g. "DynamoDB calls per job, happy path"
    value: float
    unit: str
    command: str  # the command that reproduces it
    baseline: float | None = None
    goal: Goal | None = None
    goal_on: str = "value"
    note: str = ""

    @property
    def ratio(self) -> float | None:
        if self.baseline is None or self.baseline == 0:
            return None
        return self.value / self.baseline

    @property
    def met(self) -> bool | None:
        if self.goal is None:
            return None
        measured = self.ratio if self.goal_on == "ratio" else self.value
        return None if measured is None else self.goal.met_by(measured)
