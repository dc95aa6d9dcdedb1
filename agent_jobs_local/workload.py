"""The demo workload: simulated agents submitting interleaved jobs over many workspaces through the HTTP API, with
producer retries, duplicate sends, raw redeliveries, a poison message and worker faults; then a verification of
every invariant against the table and the workspaces themselves.

Each workspace is a real git repository: `create_remote` makes a bare remote with a first commit on `main`, and
`register_workspaces` registers it through the API (`PUT /workspaces/{workspaceId}`) with its branch, its test
command and the GitHub repository its pull request goes to. Every API call carries a bearer token of the tenant,
minted with the local development key (`auth.mint_token`).

The workload lives in sibling modules, re-exported here: `workload_plan` (the configuration and the plan),
`workload_api` (the HTTP calls), `workload_remotes` (git remotes and their registration), `workload_agents` (the
simulated agents) and `workload_verify` (the verification report)."""

from agent_jobs_local.workload_agents import Agents, Submissions
from agent_jobs_local.workload_api import NO_ANSWER
from agent_jobs_local.workload_api import send as _send
from agent_jobs_local.workload_plan import (
    BASE_BRANCH,
    BATCH_SIZE,
    CRASH_FAULTS,
    DEFAULT_TENANT,
    GITHUB_OWNER,
    PASSING_TEST_COMMAND,
    POISON_BODY,
    TEST_SUITE,
    TOKEN_TTL_SECONDS,
    Plan,
    PlannedJob,
    WorkloadConfig,
    branch_of_workspace,
    github_repository_of,
    make_plan,
)
from agent_jobs_local.workload_remotes import create_remote, register_workspaces, registration_body, remote_path
from agent_jobs_local.workload_verify import (
    PullRequestSeen,
    Report,
    ReportLine,
    check_pull_requests,
    check_test_results,
    count_worker_metric,
    scan_items,
    verify,
)

__all__ = [
    "BASE_BRANCH",
    "BATCH_SIZE",
    "CRASH_FAULTS",
    "DEFAULT_TENANT",
    "GITHUB_OWNER",
    "NO_ANSWER",
    "PASSING_TEST_COMMAND",
    "POISON_BODY",
    "TEST_SUITE",
    "TOKEN_TTL_SECONDS",
    "Agents",
    "Plan",
    "PlannedJob",
    "PullRequestSeen",
    "Report",
    "ReportLine",
    "Submissions",
    "WorkloadConfig",
    "_send",
    "branch_of_workspace",
    "check_pull_requests",
    "check_test_results",
    "count_worker_metric",
    "create_remote",
    "github_repository_of",
    "make_plan",
    "register_workspaces",
    "registration_body",
    "remote_path",
    "scan_items",
    "verify",
]
