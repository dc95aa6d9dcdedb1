"""Deterministic simulation: the product's own code on a simulated AWS (SQS FIFO with a DLQ, a DynamoDB subset, a
git remote as a compare-and-swap ref store) under a seeded scheduler that injects faults at every step, so a failing
schedule is a seed that replays exactly. Local tooling only: never deployed."""

import sys
from pathlib import Path

# The worker's package is deployed code (its function folder is /var/task in Lambda), not installed: the simulation
# imports it from its folder, as the tests do.
_WORKER_FOLDER = str(Path(__file__).resolve().parent.parent / "functions" / "job_worker")
if _WORKER_FOLDER not in sys.path:
    sys.path.append(_WORKER_FOLDER)
