"""The local Lambda Invoke endpoint: boto3's Invoke answered as Lambda answers it, each invocation in a new bubblewrap
sandbox that sees nothing of this machine but the interpreter, and no bwrap means nothing runs."""

from __future__ import annotations

import base64
import hashlib
import http.server
import io
import json
import subprocess
import tarfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError

from agent_jobs_local.lambda_endpoint import LocalLambdaEndpoint
from agent_jobs_local.sandbox import find_bwrap
from agent_jobs_local.template import TemplateModel

REPO = Path(__file__).resolve().parents[2]
SANDBOX_CODE = REPO / "functions" / "test_sandbox"
COMMIT = "0" * 40

PROBE_HANDLER = """
import json, os, socket, subprocess, time

def handler(event, context):
    print("probe log line")
    action = event.get("action")
    if action == "raise":
        raise ValueError("the probe raised")
    if action == "exit":
        os._exit(7)
    if action == "sleep":
        subprocess.Popen(["sh", "-c", "exec setsid sh -c 'while :; do sleep 0.2; done' " + event["marker"]])
        time.sleep(60)
    if action == "shell":
        done = subprocess.run(["sh", "-c", event["script"]], capture_output=True, text=True)
        return {"out": done.stdout, "err": done.stderr, "code": done.returncode}
    return {
        "tenant": context.tenant_id,
        "remainingMs": context.get_remaining_time_in_millis(),
        "memory": context.memory_limit_in_mb,
        "environment": dict(os.environ),
        "cwd": os.getcwd(),
        "event": event,
    }
"""


def function_template(code_uri: str, handler: str, **properties: Any) -> dict[str, Any]:
    """A template with one directly invoked function (no Events), per-tenant unless told otherwise."""
    own = {
        "CodeUri": code_uri,
        "Handler": handler,
        "Runtime": "python3.13",
        "Timeout": 20,
        "MemorySize": 256,
        "TenancyConfig": {"TenantIsolationMode": "PER_TENANT"},
        "Environment": {"Variables": {"SANDBOX_SETTING": "on", "API_TOKEN": "not-for-the-sandbox"}},
        **properties,
    }
    return {
        "Globals": {"Function": {"Environment": {"Variables": {"TABLE_NAME": "jobs-table"}}}},
        "Resources": {"SandboxFunction": {"Type": "AWS::Serverless::Function", "Properties": own}},
    }


@pytest.fixture
def probe_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "probe"
    folder.mkdir()
    (folder / "probe.py").write_text(PROBE_HANDLER, encoding="utf-8")
    return folder


def start_endpoint(template: dict[str, Any], template_dir: Path, **options: Any) -> LocalLambdaEndpoint:
    return LocalLambdaEndpoint(TemplateModel(template, stack_name="sandbox-test"), template_dir=template_dir, **options)


@pytest.fixture
def probe(probe_dir: Path) -> Iterator[LocalLambdaEndpoint]:
    with start_endpoint(function_template(str(probe_dir), "probe.handler"), probe_dir.parent) as endpoint:
        yield endpoint


def lambda_client(endpoint: LocalLambdaEndpoint) -> Any:
    return boto3.client(
        "lambda",
        endpoint_url=endpoint.url,
        region_name="us-east-1",
        config=Config(retries={"total_max_attempts": 1}, read_timeout=120),
    )


def invoke(endpoint: LocalLambdaEndpoint, event: dict[str, Any], tenant: str | None = "acme") -> tuple[Any, Any]:
    kwargs: dict[str, Any] = {"FunctionName": "sandbox-test-SandboxFunction", "Payload": json.dumps(event)}
    if tenant is not None:
        kwargs["TenantId"] = tenant
    answer = lambda_client(endpoint).invoke(**kwargs)
    return answer, json.loads(answer["Payload"].read())


def test_endpoint_runs_the_handler_in_a_sandbox_with_the_template_settings(probe: LocalLambdaEndpoint) -> None:
    answer, payload = invoke(probe, {"action": "describe", "n": 1}, tenant="acme")

    assert answer["StatusCode"] == 200
    assert "FunctionError" not in answer
    assert payload["tenant"] == "acme"
    assert payload["event"] == {"action": "describe", "n": 1}
    assert 0 < payload["remainingMs"] <= 20_000
    assert payload["memory"] == 256
    assert payload["cwd"] == "/var/task"
    environment = payload["environment"]
    # The function's own non-secret setting, never Globals' data-plane settings nor anything like a credential
    assert environment["SANDBOX_SETTING"] == "on"
    assert "TABLE_NAME" not in environment
    assert "API_TOKEN" not in environment
    assert not {name for name in environment if (name.startswith("AWS_") and "KEY" in name) or "TOKEN" in name}
    assert environment["PATH"].split(":")[0].endswith("/bin")
    assert probe.invocations == 1


def test_per_tenant_function_refuses_an_invocation_without_a_tenant(probe: LocalLambdaEndpoint) -> None:
    with pytest.raises(ClientError) as raised:
        invoke(probe, {"action": "describe"}, tenant=None)

    assert raised.value.response["Error"]["Code"] == "InvalidParameterValueException"
    assert raised.value.response["ResponseMetadata"]["HTTPStatusCode"] == 400
    assert probe.invocations == 0


def test_function_without_tenancy_refuses_a_tenant(probe_dir: Path) -> None:
    template = function_template(str(probe_dir), "probe.handler")
    del template["Resources"]["SandboxFunction"]["Properties"]["TenancyConfig"]
    with start_endpoint(template, probe_dir.parent) as endpoint:
        with pytest.raises(ClientError) as raised:
            invoke(endpoint, {}, tenant="acme")
        assert raised.value.response["Error"]["Code"] == "InvalidParameterValueException"
        _, payload = invoke(endpoint, {"action": "describe"}, tenant=None)
        assert payload["tenant"] is None


def test_unknown_function_is_resource_not_found(probe: LocalLambdaEndpoint) -> None:
    with pytest.raises(ClientError) as raised:
        lambda_client(probe).invoke(FunctionName="no-such-function", TenantId="acme", Payload=b"{}")
    assert raised.value.response["Error"]["Code"] == "ResourceNotFoundException"
    assert raised.value.response["ResponseMetadata"]["HTTPStatusCode"] == 404


def test_function_is_found_by_its_arn(probe: LocalLambdaEndpoint) -> None:
    arn = probe.functions["SandboxFunction"].function_arn
    answer = lambda_client(probe).invoke(FunctionName=arn, TenantId="acme", Payload=b'{"action": "describe"}')
    assert json.loads(answer["Payload"].read())["tenant"] == "acme"


def test_handler_exception_is_an_unhandled_function_error_with_its_log(probe: LocalLambdaEndpoint) -> None:
    answer = lambda_client(probe).invoke(
        FunctionName="sandbox-test-SandboxFunction", TenantId="acme", Payload=b'{"action": "raise"}', LogType="Tail"
    )
    payload = json.loads(answer["Payload"].read())

    assert answer["FunctionError"] == "Unhandled"
    assert payload == {"errorMessage": "the probe raised", "errorType": "ValueError"}
    assert "probe log line" in base64.b64decode(answer["LogResult"]).decode()


def test_every_invocation_gets_a_sandbox_of_its_own(probe: LocalLambdaEndpoint) -> None:
    # Given a first tenant's run that leaves a file in /tmp and a process behind
    leave = "echo acme-was-here > /tmp/left-behind; setsid sleep 30 > /dev/null 2>&1 < /dev/null & echo started"
    _, first = invoke(probe, {"action": "shell", "script": leave}, tenant="acme")
    # When the next invocation (another tenant's) looks for them
    look = "cat /tmp/left-behind 2>&1; ls /proc | grep -cE '^[0-9]+$'; pgrep -c sleep || true"
    _, second = invoke(probe, {"action": "shell", "script": look}, tenant="mallory")

    # Then it sees neither: a fresh /tmp and only its own processes
    assert "started" in first["out"]
    assert "acme-was-here" not in second["out"]
    assert "No such file" in second["out"]
    assert second["out"].splitlines()[-1] == "0"


def test_handler_that_cannot_be_imported_is_an_init_error(probe_dir: Path) -> None:
    template = function_template(str(probe_dir), "missing_module.handler")
    with start_endpoint(template, probe_dir.parent) as endpoint:
        answer, payload = invoke(endpoint, {})

    assert answer["FunctionError"] == "Unhandled"
    assert payload["errorType"] == "Runtime.ImportModuleError"
    assert "missing_module" in payload["errorMessage"]


def test_crash_is_an_unhandled_function_error(probe: LocalLambdaEndpoint) -> None:
    answer, payload = invoke(probe, {"action": "exit"})

    assert answer["FunctionError"] == "Unhandled"
    assert payload["errorType"] == "Runtime.ExitError"
    assert "exit status 7" in payload["errorMessage"]


def host_processes_with(marker: str) -> str:
    return subprocess.run(["pgrep", "-af", marker], capture_output=True, text=True, check=False).stdout


def test_timeout_kills_the_sandbox_and_everything_it_started(probe_dir: Path) -> None:
    # Given a function whose Timeout is 2 s and a handler that leaves a setsid daemon and then sleeps
    marker = f"sandbox-daemon-{uuid.uuid4().hex}"
    template = function_template(str(probe_dir), "probe.handler", Timeout=2)
    with start_endpoint(template, probe_dir.parent) as endpoint:
        started = time.monotonic()
        answer, payload = invoke(endpoint, {"action": "sleep", "marker": marker})
        elapsed = time.monotonic() - started

    # Then Lambda's timeout error comes back at the Timeout, and no process of the sandbox is left on this machine
    assert answer["FunctionError"] == "Unhandled"
    assert payload == {"errorMessage": "Task timed out after 2.00 seconds", "errorType": "Sandbox.Timedout"}
    assert 2 <= elapsed < 10
    deadline = time.monotonic() + 5
    while host_processes_with(marker) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert host_processes_with(marker) == ""


def test_no_process_of_the_sandbox_holds_the_callers_environment(
    probe: LocalLambdaEndpoint, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a caller whose environment holds credentials and settings
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "caller-secret-key")
    monkeypatch.setenv("QUEUE_URL", "http://caller-queue")
    # When the sandboxed code reads every environment it can see, bwrap's own (its PID 1) included
    script = "for f in /proc/[0-9]*/environ; do echo \"$f\"; tr '\\0' '\\n' < $f; done 2>&1"
    _, payload = invoke(probe, {"action": "shell", "script": script})
    seen = payload["out"] + payload["err"]

    # Then none of the caller's environment is there
    assert "/proc/1/environ" in seen
    assert "caller-secret-key" not in seen
    assert "caller-queue" not in seen


def test_sandbox_sees_no_host_file_process_or_network(probe: LocalLambdaEndpoint, tmp_path: Path) -> None:
    secret = tmp_path / "host-secret.txt"
    secret.write_text("host secret", encoding="utf-8")
    port = probe.url.rsplit(":", 1)[1]
    script = f"""
        cat {secret} 2>&1; cat {REPO / "pyproject.toml"} 2>&1; cat /etc/shadow 2>&1
        echo "root: $(ls / | tr '\\n' ' ')"
        echo "processes: $(ls /proc | grep -E '^[0-9]+$' | wc -l)"
        echo "write: $(touch /usr/x 2>&1; touch /var/task/x 2>&1)"
        python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:{port}/', timeout=3)" 2>&1 | tail -1
    """
    _, payload = invoke(probe, {"action": "shell", "script": script})
    seen = payload["out"] + payload["err"]
    print(seen)

    assert "host secret" not in seen
    assert "[tool." not in seen  # the project folder is not there
    assert "shadow: No such file" in seen
    top_level = set(seen.split("root: ")[1].splitlines()[0].split())
    # /root only when the interpreter lives under it (pyenv); never /work, /home, /mnt or the project
    assert top_level <= {"bin", "dev", "etc", "lib", "lib64", "proc", "root", "sbin", "tmp", "usr", "var"}
    processes = int(seen.split("processes: ")[1].split()[0])
    assert processes < 10  # its own few, not this machine's
    assert "Read-only file system" in seen
    assert "Connection refused" in seen or "Network is unreachable" in seen


def test_without_bwrap_nothing_runs_and_the_error_names_the_package(probe_dir: Path, tmp_path: Path) -> None:
    template = function_template(str(probe_dir), "probe.handler")
    with start_endpoint(template, probe_dir.parent, bwrap=str(tmp_path / "no-bwrap-here")) as endpoint:
        answer, payload = invoke(endpoint, {"action": "describe"})
        assert endpoint.invocations == 0

    assert answer["FunctionError"] == "Unhandled"
    assert payload["errorType"] == "Sandbox.Unavailable"
    assert "apt-get install bubblewrap" in payload["errorMessage"]


def test_find_bwrap_follows_the_setting(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENT_JOBS_BWRAP", str(tmp_path / "missing"))
    assert find_bwrap() is None
    monkeypatch.delenv("AGENT_JOBS_BWRAP")
    monkeypatch.setenv("PATH", str(tmp_path))
    assert find_bwrap() is None


# --- the real test sandbox handler ---------------------------------------------------------------------------------


def checkout_archive(files: dict[str, str]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for name, text in files.items():
            info = tarfile.TarInfo(name)
            data = text.encode()
            info.size, info.mode = len(data), 0o644
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def sandbox_event(archive: dict[str, Any], argv: list[str]) -> dict[str, Any]:
    return {
        "v": 1,
        "jobId": "job-1",
        "workspaceId": "ws-1",
        "tenantId": "acme",
        "commit": COMMIT,
        "argv": argv,
        "timeoutSeconds": 10,
        "outputLimitBytes": 4096,
        "archive": archive,
    }


@pytest.fixture
def real_sandbox() -> Iterator[LocalLambdaEndpoint]:
    template = function_template(SANDBOX_CODE.name, "test_sandbox.app.lambda_handler", Timeout=30)
    with start_endpoint(template, SANDBOX_CODE.parent) as endpoint:
        yield endpoint


def test_real_handler_runs_a_passing_and_a_failing_test_command(real_sandbox: LocalLambdaEndpoint) -> None:
    data = checkout_archive({"test_it.py": "import sys\nprint('checked', open('test_it.py').read()[:6])\n"})
    archive = {"inline": base64.b64encode(data).decode(), "sha256": hashlib.sha256(data).hexdigest()}

    _, passed = invoke(real_sandbox, sandbox_event(archive, ["python3", "test_it.py"]))
    _, failed = invoke(real_sandbox, sandbox_event(archive, ["sh", "-c", "echo broken; exit 3"]))

    assert passed["outcome"] == "passed", passed
    assert "checked import" in passed["outputTail"]
    assert (failed["outcome"], failed["exitCode"]) == ("failed", 3)
    assert "broken" in failed["outputTail"]


def test_archive_by_url_is_downloaded_outside_and_given_inline(real_sandbox: LocalLambdaEndpoint) -> None:
    data = checkout_archive({"check.sh": "echo from-the-url-archive\n"})

    class Archive(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Archive)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/checkout.tar.gz"
        archive = {"url": url, "sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
        _, payload = invoke(real_sandbox, sandbox_event(archive, ["sh", "check.sh"]))
        short = {**archive, "size": len(data) - 1}
        short_answer, short_payload = invoke(real_sandbox, sandbox_event(short, ["sh", "check.sh"]))
    finally:
        server.shutdown()
        server.server_close()

    assert payload["outcome"] == "passed", payload
    assert "from-the-url-archive" in payload["outputTail"]
    assert short_answer["FunctionError"] == "Unhandled"
    assert "larger than its declared size" in short_payload["errorMessage"]
