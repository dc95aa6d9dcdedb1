"""The documented `sam local` commands: the ones this suite runs, and how docs/sam-local.md shows them.

`COMMANDS` is the list, in order; the page's "The commands" section shows exactly these in its first `sh` block (a
test compares them), written with `\\` continuations and `# ` comments, which `documented_commands` takes out again.
"""

from __future__ import annotations

import re
from typing import Final

from tests.documentation import doc_section

PAGE: Final = "docs/sam-local.md"
SECTION: Final = "The commands"
# What the API's job of the start-api example writes: a new file, so it applies on whatever head repo-gamma has.
START_API_JOB: Final = (
    '{"jobId":"api-1","workspaceId":"repo-gamma","type":"apply_patch","payload":{"patch":"--- /dev/null\\n'
    '+++ b/NOTES.md\\n@@ -0,0 +1 @@\\n+from sam local\\n","commitMessage":"Add notes"}}'
)
COMMANDS: Final = [
    'make venv && export PATH="$PWD/.venv/bin:$PATH"',
    "ARCH=$(uname -m | sed s/aarch64/arm64/)",
    "make build-sam-local",
    "rm -f env.local.json",
    "make local LOCAL_ARGS=--sam-local &",
    "until [ -f env.local.json ]; do sleep 1; done",
    "OPTS=(-t .aws-sam/sam-local/template.yaml --env-vars env.local.json --skip-pull-image"
    " --add-host host.docker.internal:host-gateway --parameter-overrides Architecture=$ARCH"
    " EndpointUrl=$(jq -r .EnqueueApiFunction.AWS_ENDPOINT_URL env.local.json))",
    "HOST=$(python -m agent_jobs_local container-host)",
    'sam local start-lambda "${OPTS[@]}" --host $HOST --port 3002 &',
    "until curl -so /dev/null $HOST:3002; do sleep 1; done",
    'sam local invoke EnqueueApiFunction "${OPTS[@]}" -e events/http_put_workspace.json',
    'sam local invoke EnqueueApiFunction "${OPTS[@]}" -e events/http_post_job.json',
    'sam local invoke EnqueueApiFunction "${OPTS[@]}" -e events/http_get_job.json',
    'sam local invoke EnqueueApiFunction "${OPTS[@]}" -e events/http_post_job_invalid.json',
    'sam local invoke JobWorkerFunction "${OPTS[@]}" -e events/sqs_fifo_two_workspaces.json',
    'sam local invoke JobWorkerFunction "${OPTS[@]}" -e events/sqs_fifo_duplicate_delivery.json',
    'sam local invoke TestSandboxFunction "${OPTS[@]}" --tenant-id tenant-demo -e events/sandbox_run_tests.json',
    'sam local start-api "${OPTS[@]}" --port 3001 &',
    "TOKEN=$(python -m agent_jobs_local token --tenant tenant-demo)",
    "until curl -sf localhost:3001/openapi.json >/dev/null; do sleep 1; done",
    'curl -s localhost:3001/jobs -H "Authorization: Bearer $TOKEN" -H "content-type: application/json"'
    f" -d '{START_API_JOB}'",
    'curl -s localhost:3001/jobs/api-1 -H "Authorization: Bearer $TOKEN"',
]


def normalized(command: str) -> str:
    return " ".join(command.split())


def documented_commands(text: str | None = None) -> list[str]:
    """The commands of the first `sh` block of docs/sam-local.md's "The commands" section (or of `text`): `\\`
    continuations joined, `  # ` comments and blank lines dropped, whitespace normalized."""
    section = text if text is not None else doc_section(PAGE, SECTION)
    match = re.search(r"```sh\n(.*?)```", section, flags=re.DOTALL)
    if match is None:
        raise ValueError(f"{PAGE}'s {SECTION!r} section has no sh block")
    commands: list[str] = []
    pending = ""
    for raw in match.group(1).splitlines():
        line = re.sub(r"\s+# .*$", "", raw) if not raw.lstrip().startswith("#") else ""
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        command = normalized(pending + line)
        pending = ""
        if command:
            commands.append(command)
    return commands
