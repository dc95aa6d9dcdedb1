"""`agent-jobs tenants share`: a tenant's own share of the worker, set with AWS credentials on the table."""

from __future__ import annotations

import json
from pathlib import Path

from agent_jobs.tenant_shares import TenantShares
from tests.cli.test_dlq import connection_file, run
from tests.conftest import Stack


def test_tenants_share_sets_shows_and_removes_a_tenants_own_share(
    server_stack: Stack, moto_server: str, tmp_path: Path
) -> None:
    path = connection_file(tmp_path, server_stack, moto_server)
    shares = TenantShares(server_stack.services.dynamodb, server_stack.table_name, default_share=10, cache_seconds=0)

    shown = run(path, "tenants", "share", "acme")
    assert shown.exit_code == 0, shown.output
    assert "no share of its own" in shown.output

    set_ = run(path, "tenants", "share", "acme", "--set", "3", "--json")
    assert set_.exit_code == 0, set_.output
    assert json.loads(set_.output) == {"tenantId": "acme", "share": 3}
    assert (shares.share_of("acme"), shares.share_of("other")) == (3, 10)

    removed = run(path, "tenants", "share", "acme", "--default")
    assert removed.exit_code == 0, removed.output
    assert shares.share_of("acme") == 10


def test_tenants_share_refuses_what_it_cannot_set(server_stack: Stack, moto_server: str, tmp_path: Path) -> None:
    path = connection_file(tmp_path, server_stack, moto_server)

    for args, said in (
        (["--set", "-1"], "0 (never deferred) to 1000"),
        (["--set", "5000"], "0 (never deferred) to 1000"),
        (["--set", "2", "--default"], "contradict"),
    ):
        answer = run(path, "tenants", "share", "acme", *args)
        assert answer.exit_code != 0, args
        assert said in answer.output, answer.output
    bad = run(path, "tenants", "share", "acme#x")
    assert bad.exit_code != 0
    assert "not a tenant id" in bad.output
    assert TenantShares(server_stack.services.dynamodb, server_stack.table_name, 0).override("acme") is None
