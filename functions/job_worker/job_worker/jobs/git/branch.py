"""A workspace branch as one fetch found it (or as the cache last saw it): its head, its job commits, and a new commit
of a patch on its head.

Within one use of the cache, what a job looks for (its trailer), applies a patch to (the head's tree) and pushes from
(the head the push expects) is this one view: an apply_patch job on a warm cache pushes once and fetches nothing on its
happy path.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

from dulwich.objects import ZERO_SHA, ObjectID
from dulwich.refs import Ref
from dulwich.repo import Repo

from job_worker.jobs.errors import RetryableJobError
from job_worker.jobs.git.commits import DEFAULT_IDENTITY, commit_of, job_commit_of, new_commit
from job_worker.jobs.git.trailer_index import ShallowHistoryError, indexed_job_commits
from job_worker.jobs.git.transport import DEEPEN_DEPTHS
from job_worker.jobs.git.trees import patched_tree
from job_worker.jobs.patching import ParsedPatch
from job_worker.jobs.workspace import ROOT_HEAD, Commit


class FetchedBranch:
    """`branch` and its `base` at the values `heads` the remote advertised to a fetch into the cache `repo`.

    A shallow cache may hold too little of the branch for the trailer walk: `deepen(depth)` fetches the tips' history
    to `depth` commits, and the walk is tried again at each of DEEPEN_DEPTHS in turn (the last is the whole history).
    A walk still cut short then (the remote branch was rewritten since these heads) is a RetryableJobError."""

    def __init__(
        self,
        repo: Repo,
        branch: Ref,
        base: Ref,
        heads: Mapping[Ref, ObjectID],
        deepen: Callable[[int], object] | None = None,
    ) -> None:
        self.repo = repo
        self.branch = branch
        self.base = base
        self.heads = dict(heads)
        self._deepen = deepen
        self._looked_for: dict[str, Commit | None] = {}
        self._indexed: list[tuple[ObjectID, str]] | None = None

    @property
    def head(self) -> str:
        """The branch's commit; before the branch exists, its base's commit (ROOT_HEAD for an empty remote)."""
        sha = self.heads.get(self.branch) or self.heads.get(self.base)
        return sha.decode() if sha else ROOT_HEAD

    def job_commits(self) -> Iterator[Commit]:
        """The branch's commits with a job trailer, newest first, down to (not into) the base branch."""
        for sha, _ in self._job_shas():
            yield job_commit_of(commit_of(self.repo.object_store, sha.decode()))

    def job_commit(self, job_id: str) -> Commit | None:
        """The branch's commit whose trailer names `job_id`, found through the cache's index of the branch's job
        commits (`jobs.git.trailer_index`), brought up to date once per use."""
        if job_id not in self._looked_for:
            found = self._indexed_commit(job_id)
            if found is not None and found.job_id != job_id:
                # An index that names a commit of another job was not written by this worker: walk the branch.
                self._indexed = None
                found = self._indexed_commit(job_id, trust_index=False)
            self._looked_for[job_id] = found
        return self._looked_for[job_id]

    def _indexed_commit(self, job_id: str, *, trust_index: bool = True) -> Commit | None:
        sha = next((sha for sha, indexed_id in self._job_shas(trust_index) if indexed_id == job_id), None)
        return None if sha is None else job_commit_of(commit_of(self.repo.object_store, sha.decode()))

    def _job_shas(self, trust_index: bool = True) -> list[tuple[ObjectID, str]]:
        if self._indexed is None:
            depths = iter(DEEPEN_DEPTHS if self._deepen is not None else ())
            while self._indexed is None:
                try:
                    self._indexed = indexed_job_commits(
                        self.repo.object_store,
                        Path(self.repo.path),
                        self.branch,
                        self.heads.get(self.branch),
                        self.heads.get(self.base),
                        trust_index=trust_index,
                        shallow=self.repo.get_shallow(),
                    )
                except ShallowHistoryError as error:
                    depth = next(depths, None)
                    if depth is None or self._deepen is None:
                        raise RetryableJobError(
                            f"the branch {self.branch.decode()} was rewritten while its history was fetched ({error});"
                            " will retry"
                        ) from error
                    self._deepen(depth)
        return self._indexed

    def new_commit(self, patch: ParsedPatch, *, message: str, author: str | None) -> ObjectID:
        """Store a commit of `patch` applied to the head's tree, on the head; returns its sha (nothing is pushed)."""
        head = self.head
        parent_tree = None if head == ROOT_HEAD else commit_of(self.repo.object_store, head).tree
        tree = patched_tree(self.repo.object_store, parent_tree, patch)
        git_commit = new_commit(
            tree,
            parents=[] if head == ROOT_HEAD else [ObjectID(head.encode())],
            message=message,
            author=author or DEFAULT_IDENTITY,
        )
        self.repo.object_store.add_object(git_commit)
        return git_commit.id

    def still_at_head(self) -> Callable[[Mapping[Ref, ObjectID]], bool]:
        """Whether the remote's refs still have the branch at this head: the condition of a compare-and-swap push."""
        expected = ObjectID(self.head.encode())

        def still_expected(refs: Mapping[Ref, ObjectID]) -> bool:
            if self.branch in refs:
                return refs[self.branch] == expected
            # First commit: the branch must not exist, and is created on the base's current commit.
            return refs.get(self.base, ZERO_SHA) == expected

        return still_expected
