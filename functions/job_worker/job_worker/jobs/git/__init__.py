"""The git side of a workspace, by concern; `jobs.git_workspace` puts it together as the workspace the handlers use.

- `remote`: which remote and branch a workspace is (`GitRemote`, `GitCredentials`);
- `transport`: fetches and compare-and-swap pushes, and the stale ref locks of a local remote;
- `confinement`: a file-system remote kept inside its tenant's folder, through git's own pointers too;
- `bounded_fetch` and `object_sizes`: what one fetch may bring in, checked before any object is inflated;
- `cache`: the bare cache repository per workspace, and the budget of all caches;
- `consolidation`: few packs in a cache and in a local remote, as git's `gc --auto` keeps them;
- `branch`: the branch as one fetch found it (or the cache last saw it), and a commit of a patch on its head;
- `trees`: a patch applied to a tree, a tree written out as a checkout;
- `commits`: the `Agent-Job-Id` trailer, the job commits of a branch, the test-result refs;
- `trailer_index`: the job commits of a branch, indexed in the cache so that a job walks only what is new;
- `new_objects`: what a push sends, without walking the history.
"""
