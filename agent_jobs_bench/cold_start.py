"""Cold start: the import time of the worker and producer modules in a fresh interpreter, against `import boto3`
alone measured in the same run the same way.

Each sample is a new interpreter started as Lambda starts one: the working directory is the function's folder, the
function folder and the layer folder (`layers/shared`, /opt/python in Lambda) are on `sys.path`, and the environment
is the function's own (from template.yaml) on top of Lambda's reserved variables. The interpreter times its own
`import app` (or `import boto3`), so interpreter start-up, common to all three, is left out. The three kinds of
sample are interleaved so that the machine's noise falls on all of them alike; the figure is each median.

The worker's first invocation is timed in the same interpreter right after the import: one apply_patch job on a
registered git workspace, through the local runtime's emulator (the job is enqueued over HTTP with a real token and
received from the queue as Lambda's event source would). It has no goal: it shows where the cost of lazy imports went.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from agent_jobs_bench.figures import Comparison, Figure, Goal

BENCHMARK = "Cold start"
COMMAND = ".venv/bin/python -m agent_jobs_bench --only cold_start"
PROJECT_ROOT = Path(__file__).resolve().parent.parent
LAYER_DIR = PROJECT_ROOT / "layers" / "shared"
WORKER_DIR = PROJECT_ROOT / "functions" / "job_worker"
PRODUCER_DIR = PROJECT_ROOT / "functions" / "enqueue_api"
GOAL = Goal(1.3, Comparison.AT_MOST, "<= 1.3x the import time of boto3 alone")
RUNS = 15
QUICK_RUNS = 5
# What every worker invocation needs before the product's own code: a reference for how low the ratio can go without
# moving modules every invocation uses from the import to the first invocation.
LIBRARY_FLOOR = ", ".join(
    (
        "boto3",
        "pydantic",
        "pydantic_settings",
        "aws_lambda_powertools",
        "aws_lambda_powertools.utilities.batch",
        "aws_xray_sdk.core",
    )
)
PATCH = "--- a/bench.txt\n+++ b/bench.txt\n@@ -0,0 +1 @@\n+cold start\n"

# What the fresh interpreter runs: time one import, then (worker, when given an event) one invocation.
_SAMPLE = """
import json, sys, time
started = time.perf_counter()
import {module}
imported = time.perf_counter()
result = {{"import": imported - started}}
if len(sys.argv) > 1:
    from agent_jobs_local.event_source import LambdaContextStub
    event = json.loads(open(sys.argv[1]).read())
    started = time.perf_counter()
    response = {module}.lambda_handler(event, LambdaContextStub(timeout_seconds=120))
    result["invoke"] = time.perf_counter() - started
    result["failures"] = len(response["batchItemFailures"])
print(json.dumps(result))
"""


def python_executable() -> str:
    """The interpreter the functions run on: this one when it is 3.13 (the project's virtualenv), which also has the
    functions' dependencies; pyenv's bare 3.13 has none, so it is not used."""
    return sys.executable


def sample(
    module: str, function_dir: Path, environment: Mapping[str, str], event_file: Path | None = None
) -> dict[str, float]:
    """One fresh interpreter: `import module` from `function_dir` as Lambda imports a handler; the seconds it took
    (and the first invocation's seconds when `event_file` holds an event)."""
    env = dict(environment)
    # Lambda's sys.path: the function folder (/var/task) then the layer (/opt/python); the project root only so the
    # invocation can use the runtime's context stub (imported after the timed import, so it costs the import nothing).
    env["PYTHONPATH"] = os.pathsep.join([str(function_dir), str(LAYER_DIR), str(PROJECT_ROOT)])
    command = [python_executable(), "-c", _SAMPLE.format(module=module)]
    if event_file is not None:
        command.append(str(event_file))
    completed = subprocess.run(
        command, check=False, cwd=function_dir, env=env, capture_output=True, text=True, timeout=120
    )
    if completed.returncode != 0:
        raise RuntimeError(f"importing {module} from {function_dir} failed:\n{completed.stderr[-3000:]}")
    result: dict[str, float] = json.loads(completed.stdout.strip().splitlines()[-1])
    return result


def base_environment() -> dict[str, str]:
    """Lambda's reserved variables with fake credentials, for the import-only samples."""
    from agent_jobs_local.execution_environment import lambda_environment

    return lambda_environment(
        {},
        function_id="ColdStart",
        handler="job_worker.app.lambda_handler",
        code_dir=WORKER_DIR,
        region="us-east-1",
        timeout_seconds=120,
        memory_size_mb=512,
        endpoint_url=None,
    )


class _FirstInvocations:
    """The local runtime (its poller stopped: this benchmark is the event source) with one registered git
    workspace and one enqueued apply_patch job per sample; `event(n)` writes the n-th job's Lambda event."""

    def __init__(self, count: int, folder: Path) -> None:
        from agent_jobs_local.runtime import LocalRuntime

        self.folder = folder
        self.count = count
        self.runtime = LocalRuntime(workspaces_root=folder / "workspaces")

    def __enter__(self) -> _FirstInvocations:
        from agent_jobs_bench.submit import submit_patch_job
        from agent_jobs_local.auth import mint_token
        from agent_jobs_local.execution_environment import lambda_environment
        from agent_jobs_local.workload import create_remote, register_workspaces, remote_path

        runtime = self.runtime.start()
        runtime.poller.stop()
        workspaces = [f"cold-{n}" for n in range(self.count)]
        remotes = {ws: create_remote(remote_path(runtime.remotes_root, ws), ws) for ws in workspaces}
        register_workspaces(runtime.api_url, remotes, github_api_url="https://api.github.com")
        token = mint_token("default")
        for ws in workspaces:
            submit_patch_job(runtime.api_url, token, f"job-{ws}", ws, patch=PATCH, message="cold start")
        worker_id = runtime.model.worker.function.function_id
        self.environment = lambda_environment(
            runtime.function_env[worker_id],
            function_id=worker_id,
            handler="job_worker.app.lambda_handler",
            code_dir=WORKER_DIR,
            region=runtime.resources.region,
            timeout_seconds=120,
            memory_size_mb=512,
            endpoint_url=runtime.endpoint_url,
        )
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.runtime.stop()

    def event(self, n: int) -> Path:
        from agent_jobs_local.event_source import receive_event

        resources = self.runtime.resources
        sqs = self.runtime._clients().sqs
        event: dict[str, Any] = {"Records": []}
        while not event["Records"]:  # one message: the next workspace's only job
            event = receive_event(
                sqs, resources.queue_url, queue_arn=resources.queue_arn, region=resources.region, batch_size=1
            )
        path = self.folder / f"event-{n}.json"
        path.write_text(json.dumps(event))
        return path


def run(quick: bool = False) -> list[Figure]:
    runs = QUICK_RUNS if quick else RUNS
    samples: dict[str, list[float]] = {"boto3": [], "worker": [], "producer": [], "invoke": [], "floor": []}
    failures = 0
    with tempfile.TemporaryDirectory(prefix="agent-jobs-cold-") as tmp, _FirstInvocations(runs, Path(tmp)) as first:
        plain = base_environment()
        for n in range(runs):
            # Interleaved, so the machine's noise falls on the three alike.
            samples["boto3"].append(sample("boto3", WORKER_DIR, plain)["import"])
            worker = sample("job_worker.app", WORKER_DIR, first.environment, first.event(n))
            samples["worker"].append(worker["import"])
            samples["invoke"].append(worker["invoke"])
            failures += int(worker["failures"])
            samples["producer"].append(sample("enqueue_api.app", PRODUCER_DIR, plain)["import"])
            samples["floor"].append(sample(LIBRARY_FLOOR, WORKER_DIR, plain)["import"])
    if failures:
        raise RuntimeError(f"{failures} of the worker's first invocations reported a failed record")
    median = {name: statistics.median(values) * 1000 for name, values in samples.items()}
    python = f"Python {sys.version_info.major}.{sys.version_info.minor}"
    note = f"median of {runs} fresh interpreters ({python}); baseline: `import boto3` alone, same run"
    return [
        Figure(BENCHMARK, "import boto3 alone", median["boto3"], "ms", COMMAND, note=note),
        Figure(
            BENCHMARK,
            "worker module import (functions/job_worker/job_worker/app.py)",
            median["worker"],
            "ms",
            COMMAND,
            baseline=median["boto3"],
            goal=GOAL,
            goal_on="ratio",
            note=note,
        ),
        Figure(
            BENCHMARK,
            "producer module import (functions/enqueue_api/enqueue_api/app/)",
            median["producer"],
            "ms",
            COMMAND,
            baseline=median["boto3"],
            goal=GOAL,
            goal_on="ratio",
            note=note,
        ),
        Figure(
            BENCHMARK,
            "worker first invocation after import (one apply_patch job, git workspace, emulator)",
            median["invoke"],
            "ms",
            COMMAND,
            note="no goal: where the cost of the lazy imports went (clients, job parse, git), same interpreters",
        ),
        Figure(
            BENCHMARK,
            "libraries every worker invocation needs, imported alone (reference)",
            median["floor"],
            "ms",
            COMMAND,
            baseline=median["boto3"],
            note=f"no goal: `import {LIBRARY_FLOOR}`, the floor of the worker's import unless modules every "
            "invocation uses move into the first invocation (which a cold start pays all the same)",
        ),
        *(
            Figure(
                BENCHMARK,
                f"{name} module import against the libraries' floor",
                median[name],
                "ms",
                COMMAND,
                baseline=median["floor"],
                note="no goal: the ratio is what the product's own modules add to the libraries every invocation "
                "needs (the floor above), same run",
            )
            for name in ("worker", "producer")
        ),
    ]
