"""What a push sends: the objects of the new commits that the remote does not have yet, found without walking history.

dulwich's own `generate_pack_data(have, want)` first collects every commit reachable from what the remote advertises
(the whole history, on every push), then every tree and blob of the commits where the new ones meet it. A workspace
push is one new commit on the head the remote advertised, so the cost grew with the branch's history, and a cache
that does not hold all of that history (a shallow first fetch) could not push at all.

Here the new commits are walked from what is pushed back to the first commits the remote advertises (`have`), and each
new commit's tree is compared path by path with its parents' trees: a subtree or file that is the same object at the
same path in a parent is on the remote already (a remote that advertises a commit has everything it reaches), so it
and everything under it is skipped. What is sent is the new commit, its changed trees and its changed files: the work
grows with the size of the change, not with the history or the size of the tree.

Resending an object the remote has (a file moved to another path) is harmless, only larger; missing one is not, and
cannot happen: every path of a new tree is either sent or equal to the same path of a parent the remote has.
"""

from __future__ import annotations

import stat
from collections.abc import Iterable, Set

from dulwich.object_store import BaseObjectStore
from dulwich.objects import Commit, ObjectID, Tree

_SUBMODULE_MODE = 0o160000


def objects_to_send(store: BaseObjectStore, have: Set[ObjectID], want: Iterable[ObjectID]) -> list[ObjectID]:
    """The objects `store` must send so that a remote holding `have` (and all they reach) holds all of `want`."""
    found: dict[ObjectID, None] = {}  # ordered, so the pack lists commits first
    for commit in _new_commits(store, have, want, found):
        parent_trees = [_commit(store, parent).tree for parent in commit.parents]
        _new_tree_objects(store, commit.tree, parent_trees, found)
    return list(found)


def _new_commits(
    store: BaseObjectStore, have: Set[ObjectID], want: Iterable[ObjectID], found: dict[ObjectID, None]
) -> list[Commit]:
    """The commits reachable from `want` that are not in `have` (down to the haves, not into them); objects of `want`
    that are not commits are added to `found` whole (a tree, with what it holds)."""
    commits: list[Commit] = []
    pending = [sha for sha in want if sha not in have]
    while pending:
        sha = pending.pop()
        if sha in found or sha in have:
            continue
        obj = store[sha]
        if isinstance(obj, Tree):
            _new_tree_objects(store, obj.id, [], found)
            continue
        found[sha] = None
        if isinstance(obj, Commit):
            commits.append(obj)
            pending.extend(parent for parent in obj.parents if parent not in have)
    return commits


def _new_tree_objects(
    store: BaseObjectStore, tree_id: ObjectID, old_tree_ids: list[ObjectID], found: dict[ObjectID, None]
) -> None:
    """Add `tree_id` and what it holds to `found`, except what is the same object at the same path in one of the
    `old_tree_ids` (the same path's trees in the parents, which the remote has)."""
    if tree_id in old_tree_ids or tree_id in found:
        return
    found[tree_id] = None
    tree = store[tree_id]
    assert isinstance(tree, Tree)
    old_trees = [_tree(store, old) for old in old_tree_ids]
    for entry in tree.iteritems():
        name, mode, sha = entry.path, entry.mode, entry.sha
        if mode == _SUBMODULE_MODE:
            continue  # a submodule's commit: not an object of this repository
        old_entries = [old[name] for old in old_trees if name in old]
        if any(old_sha == sha for _, old_sha in old_entries):
            continue
        if stat.S_ISDIR(mode):
            old_folders = [old_sha for old_mode, old_sha in old_entries if stat.S_ISDIR(old_mode)]
            _new_tree_objects(store, sha, old_folders, found)
        else:
            found[sha] = None


def _commit(store: BaseObjectStore, sha: ObjectID) -> Commit:
    obj = store[sha]
    if not isinstance(obj, Commit):
        raise ValueError(f"{sha.decode()} is not a commit")
    return obj


def _tree(store: BaseObjectStore, sha: ObjectID) -> Tree:
    obj = store[sha]
    if not isinstance(obj, Tree):
        raise ValueError(f"{sha.decode()} is not a tree")
    return obj
