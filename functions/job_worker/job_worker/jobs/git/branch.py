"""A workspace branch as one fetch found it (or as the cache last saw it): its head, its job commits, and a new commit
of a patch on its head.

Within one use of the cache, what a job looks for (its trailer), applies a patch to (the head's tree) and pushes from
(the head the push expects) is this one view: an apply_patch job on a warm cache pushes once and fetches nothing on its
happy path.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

from dulwich.objects import ZERO_SHA, ObjectID
from dulwich.refs import Ref
from dulwich.repo import Repo

from job_worker.jobs.git.commits import DEFAULT_IDENTITY, commit_of, job_commits, new_commit
from job_worker.jobs.git.trees import patched_tree
from job_worker.jobs.patching import ParsedPatch
from job_worker.jobs.workspace import ROOT_HEAD, Commit


class FetchedBranch:
    """`branch` and its `base` at the values `heads` the remote advertised to a fetch into the cache `repo`."""

    def __init__(self, repo: Repo, branch: Ref, base: Ref, heads: Mapping[Ref, ObjectID]) -> None:
        self.repo = repo
        self.branch = branch
        self.base = base
        self.heads = dict(heads)
        self._looked_for: dict[str, Commit | None] = {}

    @property
    def head(self) -> str:
        """The branch's commit; before the branch exists, its base's commit (ROOT_HEAD for an empty remote)."""
        sha = self.heads.get(self.branch) or self.heads.get(self.base)
        return sha.decode() if sha else ROOT_HEAD

    def job_commits(self) -> Iterator[Commit]:
        """The branch's commits with a job trailer, newest first, down to (not into) the base branch."""
        return job_commits(self.repo.object_store, self.heads.get(self.branch), self.heads.get(self.base))

    def job_commit(self, job_id: str) -> Commit | None:
        """The branch's commit whose trailer names `job_id`; the branch is walked once per job id."""
        if job_id not in self._looked_for:
            self._looked_for[job_id] = next((c for c in self.job_commits() if c.job_id == job_id), None)
        return self._looked_for[job_id]

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
