"""Commits of a workspace branch: each carries the `Agent-Job-Id: <jobId>` trailer of the job that made it.

Test results live in the remote too, so any worker finds them: `refs/agent-jobs/tests/<jobId>/<commit>` points at a
commit whose tree holds `result.json`. A ref is created once and never moved; the first stored result wins.
"""

from __future__ import annotations

import re
import time

from dulwich.object_store import BaseObjectStore
from dulwich.objects import Commit as GitCommit
from dulwich.objects import ObjectID
from dulwich.refs import Ref, check_ref_format

from agent_jobs.models import ID_PATTERN
from job_worker.jobs.workspace import JOB_TRAILER, ROOT_HEAD, Commit

DEFAULT_IDENTITY = "Agent Jobs <agent-jobs@localhost>"
TEST_RESULTS_NAMESPACE = "refs/agent-jobs/tests"
TEST_RESULT_FILE = b"result.json"

IDENTITY = re.compile(r"^[^<>\n]+ <[^<>\n]+>$")
SHA = re.compile(r"^[0-9a-f]{40}$")
_MAX_JOB_ID = 64  # JobId's max_length
_TRAILER = re.compile(rb"^" + re.escape(JOB_TRAILER.encode()) + rb":[ \t]*(\S+)[ \t]*$", re.MULTILINE)


def job_commit_of(commit: GitCommit) -> Commit:
    """`commit` as a workspace commit: its sha, first parent and the job id of its trailer ("" without one)."""
    parents = commit.parents
    return Commit(
        sha=commit.id.decode(),
        parent=parents[0].decode() if parents else ROOT_HEAD,
        job_id=job_id_of(commit.message) or "",
        message=commit.message.decode("utf-8", errors="replace"),
        patch="",  # git keeps the trees, not the patch text; `git diff <parent> <sha>` shows the change
    )


def job_id_of(message: bytes) -> str | None:
    """The jobId of the `Agent-Job-Id` trailer, which must be in the message's last paragraph (its trailer block)."""
    trailer_block = message.rstrip().rsplit(b"\n\n", 1)[-1]
    found = _TRAILER.findall(trailer_block)
    if not found:
        return None
    # Any text may follow the trailer in a commit someone else pushed, but a job's id is always a valid jobId: a value
    # that is not one (not ASCII, a slash) names no job, and must not break the branch's index of job commits.
    job_id = found[-1].decode("ascii", errors="replace")
    return job_id if re.fullmatch(ID_PATTERN, job_id) and len(job_id) <= _MAX_JOB_ID else None


def result_ref(job_id: str, head: str) -> Ref:
    if not re.fullmatch(ID_PATTERN, job_id) or not SHA.fullmatch(head):
        raise ValueError(f"a test result is stored per job id and commit sha, got {job_id!r} and {head!r}")
    ref = Ref(f"{TEST_RESULTS_NAMESPACE}/{job_id}/{head}".encode())
    if not check_ref_format(Ref(ref[len(b"refs/") :])):
        raise ValueError(f"job id {job_id!r} cannot name a git ref")
    return ref


def commit_of(store: BaseObjectStore, sha: str) -> GitCommit:
    obj = store[ObjectID(sha.encode())]
    if not isinstance(obj, GitCommit):
        raise ValueError(f"{sha} is not a commit")
    return obj


def new_commit(tree: ObjectID, *, parents: list[ObjectID], message: str, author: str) -> GitCommit:
    now = int(time.time())
    commit = GitCommit()
    commit.tree = tree
    commit.parents = parents
    commit.author = author.encode()
    commit.committer = DEFAULT_IDENTITY.encode()
    commit.author_time = commit.commit_time = now
    commit.author_timezone = commit.commit_timezone = 0
    commit.message = message.encode()
    return commit
