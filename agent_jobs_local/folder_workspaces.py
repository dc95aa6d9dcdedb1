"""Folder workspaces: each workspace a folder holding an append-only commit ledger, for the worker's tests, the
benchmarks and the local runtime's plans (the deployed worker runs on registered git workspaces,
`job_worker.jobs.registered`).

A folder workspace gives the job handlers the two properties the exactly-once promise rests on: a commit carries the
jobId that made it (the `Agent-Job-Id` trailer), and the branch moves only by compare-and-swap on its expected head,
so a stale worker cannot move it. The folder can be local (/tmp, tests, the local runtime) or a shared file system.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any

from agent_jobs.models import ID_PATTERN
from agent_jobs_local.unregistered_workspaces import UnregisteredWorkspaces
from job_worker.jobs.workspace import JOB_TRAILER, ROOT_HEAD, Commit, HeadMovedError


class LocalWorkspaceStore(UnregisteredWorkspaces):
    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    def open(self, workspace_id: str) -> LocalWorkspace:
        return LocalWorkspace(self.root, workspace_id)


class LocalWorkspace:
    """A workspace folder: `commits.jsonl` (the branch, oldest first), `tests/`, `pulls.json`, guarded by a lock."""

    def __init__(self, root: Path, workspace_id: str) -> None:
        if not re.fullmatch(ID_PATTERN, workspace_id):
            raise ValueError(f"not a workspace id: {workspace_id!r}")
        self.workspace_id = workspace_id
        self.path = root / workspace_id
        self.path.mkdir(parents=True, exist_ok=True)
        self._ledger = self.path / "commits.jsonl"
        self._pulls = self.path / "pulls.json"

    @contextmanager
    def _locked(self) -> Iterator[None]:
        with (self.path / ".lock").open("a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def history(self) -> list[Commit]:
        if not self._ledger.exists():
            return []
        with self._ledger.open() as ledger:
            # Only whole lines: a commit being appended by another process is not there yet.
            return [Commit(**json.loads(line)) for line in ledger if line.endswith("\n")]

    def head(self) -> str:
        commits = self.history()
        return commits[-1].sha if commits else ROOT_HEAD

    def find_commit(self, job_id: str) -> Commit | None:
        return next((c for c in self.history() if c.job_id == job_id), None)

    def commit(self, *, job_id: str, message: str, patch: str, expected_head: str, author: str | None = None) -> Commit:
        with self._locked():
            commits = self.history()
            head = commits[-1].sha if commits else ROOT_HEAD
            if head != expected_head:
                raise HeadMovedError(f"branch of {self.workspace_id} is at {head[:12]}, expected {expected_head[:12]}")
            if any(c.job_id == job_id for c in commits):  # never a second commit of one job, whatever the caller saw
                raise HeadMovedError(f"branch of {self.workspace_id} already has a commit of job {job_id}")
            full_message = f"{message}\n\n{JOB_TRAILER}: {job_id}\n"
            content = f"{head}\n{full_message}\n{patch}".encode("utf-8", errors="surrogateescape")
            sha = hashlib.sha1(content, usedforsecurity=False).hexdigest()
            commit = Commit(sha=sha, parent=head, job_id=job_id, message=full_message, patch=patch)
            with self._ledger.open("a") as ledger:
                ledger.write(json.dumps(asdict(commit)) + "\n")
                ledger.flush()
                os.fsync(ledger.fileno())
            return commit

    def stored_test_result(self, job_id: str, head: str) -> dict[str, Any] | None:
        path = self.path / "tests" / f"{job_id}-{head}.json"
        return dict(json.loads(path.read_text())) if path.exists() else None

    def store_test_result(self, job_id: str, head: str, result: dict[str, Any]) -> None:
        folder = self.path / "tests"
        folder.mkdir(exist_ok=True)
        tmp = folder / f".{job_id}-{head}.tmp"
        tmp.write_text(json.dumps(result))
        tmp.replace(folder / f"{job_id}-{head}.json")

    def _read_pulls(self) -> list[dict[str, Any]]:
        return list(json.loads(self._pulls.read_text())) if self._pulls.exists() else []

    def find_open_pull_request(self, head_branch: str) -> dict[str, Any] | None:
        with self._locked():
            return next((p for p in self._read_pulls() if p["head"] == head_branch and p["state"] == "open"), None)

    def open_pull_request(self, head_branch: str, title: str, body: str) -> dict[str, Any]:
        with self._locked():
            pulls = self._read_pulls()
            existing = next((p for p in pulls if p["head"] == head_branch and p["state"] == "open"), None)
            if existing:
                return existing
            pull = {"number": len(pulls) + 1, "head": head_branch, "title": title, "body": body, "state": "open"}
            pull["url"] = f"local://{self.workspace_id}/pulls/{pull['number']}"
            pulls.append(pull)
            staging = self._pulls.with_suffix(".tmp")
            staging.write_text(json.dumps(pulls))
            staging.replace(self._pulls)  # atomic: a crash leaves the old list or the new one, never half of one
            return pull
