"""The job commits of a workspace branch, kept in an index in its cache so that a job does not walk the whole branch.

Exactly-once rests on the trailer lookup: before a job commits, its `Agent-Job-Id` trailer is looked for on every
commit of the branch since it left its base. Walking them all on every job made each job slower than the last. Commits
never change, so what a walk found stays true: the cache keeps the job commits it found between a head and the base
(`INDEX_FILE`, inside the cache repository), and the next lookup walks only from the new head down to that indexed head
and adds what is new.

The index is used only when it is certainly right for the branch now:

- it is for this branch and for the same base commit (the base moving changes which commits are "since the base");
- the new head is the indexed head, or reaches it through commits of one parent each (what the worker makes). A
  branch rewritten by a force push, or with a merge on it, is walked in full;
- it reads as written (its format, every sha and job id). Anything else (missing, cut short, hand-edited) is ignored.

Otherwise the whole branch is walked, as without an index, and the index written anew. A shallow cache (one that
fetched the tips only: `jobs.git.transport`) may not hold the whole branch: a walk that reaches one of its shallow
commits (whose parents it lacks) before the base ends with `ShallowHistoryError`, and writes no index; the caller
deepens the cache and walks again. It is written whole to a file
aside and renamed over the old one, under the cache's lock, which every use of the cache holds: a reader never sees half
an index. Each cache (one per workspace, remote url and owner) has its own: what a tenant's remote holds never reaches
another cache's index.
"""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Set
from pathlib import Path

from dulwich.object_store import BaseObjectStore
from dulwich.objects import Commit, ObjectID
from dulwich.refs import Ref
from dulwich.walk import ORDER_TOPO, Walker

from agent_jobs.models import ID_PATTERN
from job_worker.jobs.git.commits import job_id_of

INDEX_FILE = "agent-jobs-trailers"
_FORMAT = "agent-jobs trailer index 1"
_SHA = re.compile(r"[0-9a-f]{40}")
_JOB_LINES = re.compile(r"(?:[0-9a-f]{40} " + ID_PATTERN.removeprefix("^").removesuffix("$") + r"\n)*")
_NO_BASE = "-"

JobShas = list[tuple[ObjectID, str]]  # (commit sha, job id), newest first


class ShallowHistoryError(Exception):
    """The walk reached a shallow commit of the cache before the base: the branch may go on below it."""

    def __init__(self, commit: ObjectID) -> None:
        super().__init__(f"the cache's history ends at {commit.decode()}, above the branch's base")
        self.commit = commit


def indexed_job_commits(
    store: BaseObjectStore,
    cache: Path,
    branch: Ref,
    head: ObjectID | None,
    base: ObjectID | None,
    *,
    trust_index: bool = True,
    shallow: Set[ObjectID] = frozenset(),
) -> JobShas:
    """The commits with a job trailer from `head` back, newest first, down to (not into) `base`, as (sha, job id):
    walked from `head` down to the head the cache's index was written at, or in full (see the module docstring), and
    always in full without `trust_index`. `shallow` are the cache's shallow commits: a walk that reaches one raises
    ShallowHistoryError."""
    if head is None:
        return []
    index_path = cache / INDEX_FILE
    indexed = _read(index_path, branch, base) if trust_index else None
    jobs = None if indexed is None else _above(store, head, base, *indexed, shallow=shallow)
    if jobs is None:
        jobs, head_since_base = _walk(store, head, base, shallow)
        if not head_since_base:
            # The head is the base or below it: nothing to index (an index promises its head is above the base).
            index_path.unlink(missing_ok=True)
            return jobs
    if indexed is None or indexed[0] != head:
        _write(index_path, branch, base, head, jobs)
    return jobs


def _above(
    store: BaseObjectStore,
    head: ObjectID,
    base: ObjectID | None,
    indexed_head: ObjectID,
    indexed: JobShas,
    *,
    shallow: Set[ObjectID],
) -> JobShas | None:
    """The job commits down to the base: the ones from `head` down to `indexed_head`, then the `indexed` ones below
    it; None unless `head` reaches `indexed_head` through commits of one parent each.

    That is exact: the indexed head is not the base or below it (an index is written only then), so no commit above
    it is, and with one parent each, what `head` reaches is those commits and what the indexed head reaches. A merge,
    the base or a root commit met first (a force push, a merge of the base into the branch) end the shortcut: the
    branch is then walked in full."""
    jobs: JobShas = []
    sha = head
    while sha != indexed_head:
        if sha == base or sha not in store:
            return None
        commit = store[sha]
        if not isinstance(commit, Commit) or len(commit.parents) != 1:
            return None
        job_id = job_id_of(commit.message)
        if job_id is not None:
            jobs.append((commit.id, job_id))
        sha = commit.parents[0]
    return jobs + indexed


def _walk(
    store: BaseObjectStore, head: ObjectID, base: ObjectID | None, shallow: Set[ObjectID]
) -> tuple[JobShas, bool]:
    """The job commits from `head` back, down to (not into) `base`: the whole branch; and whether `head` itself is
    above the base (walked, rather than the base or below it). Reaching a `shallow` commit one of whose parents the
    cache lacks raises ShallowHistoryError: the walk reads no parent the cache does not hold (a shallow commit of the
    base's only ends the base's exclusion there)."""

    def parents(commit: Commit) -> list[ObjectID]:
        if commit.id not in shallow:
            return list(commit.parents)
        return [parent for parent in commit.parents if parent in store]

    jobs: JobShas = []
    head_since_base = False
    walker = Walker(store, include=[head], exclude=[base] if base else None, order=ORDER_TOPO, get_parents=parents)
    for entry in walker:
        commit = entry.commit
        if commit.id in shallow and any(parent not in store for parent in commit.parents):
            raise ShallowHistoryError(commit.id)
        head_since_base = head_since_base or commit.id == head
        job_id = job_id_of(commit.message)
        if job_id is not None:
            jobs.append((commit.id, job_id))
    return jobs, head_since_base


def _read(path: Path, branch: Ref, base: ObjectID | None) -> tuple[ObjectID, JobShas] | None:
    """The indexed head and its job commits, if `path` is an index of `branch` over `base` that reads as written."""
    try:
        text = path.read_text(encoding="ascii")
    except (OSError, UnicodeDecodeError):
        return None
    header = f"{_FORMAT}\nbranch {branch.decode()}\nbase {base.decode() if base else _NO_BASE}\nhead "
    if not text.startswith(header):
        return None  # another branch or base, or not an index
    head, _, rest = text[len(header) :].partition("\n")
    body, _, end = rest.rpartition("end ")
    lines = body.split("\n")[:-1]
    # One match over all job lines (in C), and their count against the last line: an index cut short, at a line's
    # end or inside one, is never read as a shorter one.
    if not _SHA.fullmatch(head) or end != f"{len(lines)}\n" or not _JOB_LINES.fullmatch(body):
        return None
    jobs: JobShas = []
    for line in lines:
        sha, _, job_id = line.partition(" ")
        jobs.append((ObjectID(sha.encode()), job_id))
    return ObjectID(head.encode()), jobs


def _write(path: Path, branch: Ref, base: ObjectID | None, head: ObjectID, jobs: JobShas) -> None:
    """Write the index whole beside `path` and rename it into place: readers see the old index or the new one."""
    lines = [
        _FORMAT,
        f"branch {branch.decode()}",
        f"base {base.decode() if base else _NO_BASE}",
        f"head {head.decode()}",
    ]
    lines += [f"{sha.decode()} {job_id}" for sha, job_id in jobs]
    lines.append(f"end {len(jobs)}")
    text = "\n".join(lines) + "\n"
    for stale in path.parent.glob(f".{path.name}-*"):
        stale.unlink(missing_ok=True)  # left by a writer killed before its rename (the cache's lock is held)
    descriptor, staging = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}-")
    try:
        with os.fdopen(descriptor, "w", encoding="ascii") as file:
            file.write(text)
        os.replace(staging, path)
    except BaseException:
        Path(staging).unlink(missing_ok=True)
        raise
