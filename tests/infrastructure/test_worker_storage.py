"""The worker's /tmp: its ephemeral storage is a bounded template parameter, and the worker sizes its warm git caches'
budget from it, leaving room for one job's fetch and checkout."""

from __future__ import annotations

from typing import Any

from agent_jobs.settings import Settings
from agent_jobs_local.template import TemplateModel

WORKER = "JobWorkerFunction"


def test_worker_ephemeral_storage_is_a_bounded_parameter_the_worker_knows(template: dict[str, Any]) -> None:
    worker = template["Resources"][WORKER]["Properties"]
    assert worker["EphemeralStorage"] == {"Size": {"Ref": "WorkerEphemeralStorage"}}
    assert worker["Environment"]["Variables"]["EPHEMERAL_STORAGE_MB"] == {"Ref": "WorkerEphemeralStorage"}
    parameter = template["Parameters"]["WorkerEphemeralStorage"]
    assert (parameter["MinValue"], parameter["MaxValue"], parameter["Default"]) == (512, 10240, 512)


def test_worker_cache_budget_leaves_a_job_room_at_every_storage_size(template: dict[str, Any]) -> None:
    mib = 1024 * 1024
    budgets: dict[int, int] = {}
    for size in (512, 1024, 10240):
        model = TemplateModel(template, parameter_overrides={"WorkerEphemeralStorage": size})
        storage_mb = int(model.function_environment_variable(WORKER, "EPHEMERAL_STORAGE_MB") or 0)
        assert storage_mb == size
        settings = Settings(table_name="t", queue_url="q", ephemeral_storage_mb=storage_mb)
        # one job's room: a fetch landing (twice its bytes while it is indexed) and a checkout, with the defaults
        assert (settings.max_fetch_bytes, settings.max_checkout_bytes) == (100 * mib, 100 * mib)
        budgets[size] = settings.cache_budget_bytes // mib
    # what the template's storage leaves for warm caches beside that room and 64 MiB (docs/configuration.md's figures)
    assert budgets == {512: 148, 1024: 660, 10240: 9876}


def test_max_fetch_bytes_is_a_bounded_parameter_the_worker_knows(template: dict[str, Any]) -> None:
    # The fetch limit's error names this parameter: a deployer raises it without editing the template.
    worker = template["Resources"][WORKER]["Properties"]
    assert worker["Environment"]["Variables"]["MAX_FETCH_BYTES"] == {"Ref": "MaxFetchBytes"}
    parameter = template["Parameters"]["MaxFetchBytes"]
    assert (parameter["MinValue"], parameter["MaxValue"], parameter["Default"]) == (1 << 20, 1 << 32, 100 << 20)
    model = TemplateModel(template, parameter_overrides={"MaxFetchBytes": 300 << 20})
    raised = model.function_environment_variable(WORKER, "MAX_FETCH_BYTES")
    assert Settings(table_name="t", queue_url="q", max_fetch_bytes=int(raised or 0)).max_fetch_bytes == 300 << 20
