"""The cold-start benchmark (quick mode: counts and structure, never times), and the lazy imports it relies on."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from agent_jobs_bench import cold_start

# Loaded only by the jobs, routes or payloads that need them: a cold start must not import them.
WORKER_LAZY_MODULES = (
    "dulwich",
    "unidiff",
    "job_worker.jobs.git_workspace",
    "job_worker.jobs.git",
    "job_worker.jobs.patching",
    "job_worker.jobs.github",
    "job_worker.jobs.sandbox",
    "job_worker.jobs.tokens",
    "job_worker.jobs.apply_patch",
    "job_worker.jobs.run_tests",
    "job_worker.jobs.open_pr",
    "aws_lambda_powertools.utilities.parameters",
)
PRODUCER_LAZY_MODULES = ("aws_lambda_powertools.event_handler.openapi.models", "dulwich", "job_worker")

_PROBE = """
import importlib, json, sys
importlib.import_module(sys.argv[1])
import agent_jobs.models as models
factory = getattr(models, "_job_request_adapter", None)
print(json.dumps({
    "modules": sorted(sys.modules),
    "adapter_built": "job_request_adapter" in vars(models) or factory is None or factory.cache_info().currsize > 0,
    "resume_request_built": bool(models.ResumeRequest.__pydantic_complete__),
}))
"""


def import_in_fresh_interpreter(function_dir: Path, module: str) -> dict[str, Any]:
    """Import the handler's `module` as Lambda imports it (function folder and layer on sys.path, Lambda's
    variables), then what the interpreter holds."""
    environment = cold_start.base_environment()
    environment["PYTHONPATH"] = os.pathsep.join([str(function_dir), str(cold_start.LAYER_DIR)])
    completed = subprocess.run(
        [sys.executable, "-c", _PROBE, module],
        check=True,
        cwd=function_dir,
        env=environment,
        capture_output=True,
        text=True,
    )
    result: dict[str, Any] = json.loads(completed.stdout.strip().splitlines()[-1])
    return result


def loaded(modules: list[str], names: tuple[str, ...]) -> list[str]:
    return [name for name in names if any(m == name or m.startswith(f"{name}.") for m in modules)]


def test_worker_import_leaves_job_specific_modules_unloaded() -> None:
    imported = import_in_fresh_interpreter(cold_start.WORKER_DIR, "job_worker.app")

    assert "job_worker.processing" in imported["modules"]  # the probe imported the real worker
    assert loaded(imported["modules"], WORKER_LAZY_MODULES) == []
    assert imported["adapter_built"] is False
    assert imported["resume_request_built"] is False


def test_producer_import_leaves_openapi_models_unloaded() -> None:
    imported = import_in_fresh_interpreter(cold_start.PRODUCER_DIR, "enqueue_api.app")

    assert "agent_jobs.producer" in imported["modules"]
    assert loaded(imported["modules"], PRODUCER_LAZY_MODULES) == []


def test_cold_start_quick_run_measures_three_imports_and_reports_the_ratio_goal(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given every fresh interpreter the benchmark starts is counted
    samples: Counter[tuple[str, str, bool]] = Counter()
    sample = cold_start.sample

    def counted(module: str, function_dir: Path, environment: Any, event_file: Path | None = None) -> Any:
        samples[(module, function_dir.name, event_file is not None)] += 1
        return sample(module, function_dir, environment, event_file)

    monkeypatch.setattr(cold_start, "sample", counted)

    # When the quick benchmark runs
    figures = cold_start.run(quick=True)

    # Then boto3, the worker (with its first invocation), the producer and the libraries' floor were each imported
    # QUICK_RUNS times
    runs = cold_start.QUICK_RUNS
    assert samples == {
        ("boto3", "job_worker", False): runs,
        ("job_worker.app", "job_worker", True): runs,
        ("enqueue_api.app", "enqueue_api", False): runs,
        (cold_start.LIBRARY_FLOOR, "job_worker", False): runs,
    }
    boto3, worker, producer, invocation, floor, worker_on_floor, producer_on_floor = figures
    assert boto3.name == "import boto3 alone"
    assert boto3.goal is None
    for figure in (worker, producer):
        assert figure.baseline == boto3.value
        assert figure.goal is not None
        assert figure.goal.value == 1.3
        assert figure.goal_on == "ratio"
        assert figure.ratio is not None
        assert figure.met is not None
        assert figure.command == cold_start.COMMAND
    assert "worker" in worker.name
    assert "producer" in producer.name
    assert invocation.goal is None
    assert invocation.value > 0
    assert floor.goal is None
    assert floor.baseline == boto3.value
    # the product's own share: each import against the floor measured in the same run
    assert (worker_on_floor.value, worker_on_floor.baseline) == (worker.value, floor.value)
    assert (producer_on_floor.value, producer_on_floor.baseline) == (producer.value, floor.value)
    assert worker_on_floor.goal is None
