"""What one job of a git workspace may bring into the worker is bounded: the largest object (MAX_BLOB_BYTES), the pack
bytes of a fetch (MAX_FETCH_BYTES) and the bytes of a checkout (MAX_CHECKOUT_BYTES). Going over one ends the job
DEAD (PermanentJobError) naming the setting, in bounded memory, and leaves every other workspace as it was.

The memory figures come from a child process (its own peak RSS, VmHWM), which runs the job as a worker would."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from dulwich.object_format import DEFAULT_OBJECT_FORMAT
from dulwich.pack import REF_DELTA, pack_object_header

from job_worker.jobs import apply_patch
from job_worker.jobs.context import JobContext
from job_worker.jobs.errors import PermanentJobError
from job_worker.jobs.git_workspace import CHECKOUT_ENTRY_BYTES, GitRemote, GitWorkspace, GitWorkspaceStore
from job_worker.jobs.limits import GitLimits
from tests.git.bombs import MIB, NEW_FILE, StreamedRemote, bomb_pack, zero_bomb_remote
from tests.git.conftest import BASE_BRANCH, SEED_FILES, apply_patch_job, commit_files

ROOT = Path(__file__).resolve().parents[2]
PYTHONPATH = [ROOT / p for p in ("layers/shared", "functions/enqueue_api", "functions/job_worker", ".")]
BOMB_BYTES = 200 * MIB
# Well under the worker's 512 MB; inflating the bomb even once would take BOMB_BYTES on top of the interpreter.
PEAK_BOUND_MB = 256

# Runs in a child process: one apply_patch job on the bomb's workspace, then one on an ordinary workspace sharing the
# worker's cache folder. The bomb's remote is a local path, or (`network`) streamed as a network remote would.
CHILD = textwrap.dedent(
    """
    import json, sys, time
    from pathlib import Path
    from job_worker.jobs import apply_patch
    from job_worker.jobs.context import JobContext
    from job_worker.jobs.git_workspace import GitRemote, GitWorkspaceStore
    from tests.git.conftest import apply_patch_job
    from tests.git.bombs import NEW_FILE, StreamedRemote

    bomb, other, caches, mode = sys.argv[1:5]
    remotes = {"ws-bomb": bomb, "ws-other": other}
    store = GitWorkspaceStore(Path(caches), lambda ws: GitRemote(remotes[ws], f"agent/{ws}", "main"))
    report = {}
    started = time.monotonic()
    workspace = store.open("ws-bomb")
    if mode == "network":
        workspace._transport.client = StreamedRemote(Path(bomb))
    try:
        job = apply_patch_job("job-1", NEW_FILE, workspace_id="ws-bomb")
        apply_patch.run(job, JobContext(workspace, lambda: 60_000))
        report["bomb"] = "succeeded"
    except Exception as error:
        report["bomb"] = f"{type(error).__name__}: {error}"
    report["seconds"] = round(time.monotonic() - started, 3)
    if mode == "network":
        report["sent"] = workspace._transport.client.sent
    other_job = apply_patch_job("job-2", NEW_FILE, workspace_id="ws-other")
    report["other"] = apply_patch.run(other_job, JobContext(store.open("ws-other"), lambda: 60_000))
    status = Path("/proc/self/status").read_text()
    report["peak_mb"] = int(next(l for l in status.splitlines() if l.startswith("VmHWM:")).split()[1]) / 1024
    print(json.dumps(report))
    """
)


def run_child(bomb: Path, other: Path, caches: Path, mode: str) -> dict[str, Any]:
    return run_script(CHILD, str(bomb), str(other), str(caches), mode)


def run_script(source: str, *args: str) -> dict[str, Any]:
    """Run `source` in a fresh interpreter (its own peak RSS) with the project importable; its last output line, a
    JSON report."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(map(str, PYTHONPATH))}
    done = subprocess.run(
        [sys.executable, "-c", source, *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return report


@pytest.mark.parametrize("mode", ["local", "network"])
def test_a_zero_bomb_remote_ends_its_job_dead_in_bounded_memory(
    tmp_path: Path, make_remote: Callable[..., Path], mode: str
) -> None:
    # Given a remote whose branch holds one 200 MiB file of zeros (a pack of a few hundred KiB)
    bomb = zero_bomb_remote(tmp_path / "bomb.git", BOMB_BYTES)
    pack_bytes = bomb_pack(bomb).stat().st_size
    other = make_remote("other")

    # When a worker runs a job of its workspace, then a job of another workspace
    report = run_child(bomb, other, tmp_path / "caches", mode)
    print(
        f"\n{mode} remote: {BOMB_BYTES // MIB} MiB of zeros in a {pack_bytes // 1024} KiB pack: peak RSS"
        f" {report['peak_mb']:.1f} MB, the bomb's job took {report['seconds']} s"
        + (f", {report['sent']} of {pack_bytes} pack bytes sent" if mode == "network" else "")
    )

    # Then the bomb's job is refused with what to raise, the worker's memory stays bounded, the other job succeeds
    assert report["bomb"].startswith("PermanentJobError: ")
    assert f"{BOMB_BYTES}-byte git object" in report["bomb"]
    assert "MAX_BLOB_BYTES" in report["bomb"]
    assert report["peak_mb"] < PEAK_BOUND_MB
    assert report["other"]["alreadyApplied"] is False
    if mode == "network":
        assert report["sent"] < pack_bytes  # the download stopped at the object's header


def streamed_workspace(tmp_path: Path, remote: Path, pack: Path, limits: GitLimits) -> tuple[GitWorkspace, Any]:
    workspace = GitWorkspaceStore(
        tmp_path / "caches",
        lambda ws: GitRemote("https://git.example.com/r.git", f"agent/{ws}", BASE_BRANCH),
        limits=limits,
    ).open("ws-1")
    streamed = StreamedRemote(remote, pack)
    workspace._transport.client = streamed  # type: ignore[assignment]
    return workspace, streamed


def one_object_pack(path: Path, header: bytes, body: bytes) -> Path:
    """A pack of one object: `header`, then `body` compressed (its checksum is never reached by these tests)."""
    path.write_bytes(b"PACK" + (2).to_bytes(4, "big") + (1).to_bytes(4, "big") + header + zlib.compress(body))
    return path


def test_a_fetch_stops_receiving_at_max_fetch_bytes(tmp_path: Path, make_remote: Callable[..., Path]) -> None:
    # Given a remote of 2 MiB of incompressible files, and a 256 KiB limit on a fetch
    remote = make_remote("big", empty=True)
    files = {f"random-{n}.bin": os.urandom(256 * 1024) for n in range(8)}
    commit_files(remote, BASE_BRANCH, files, "big\n")
    from dulwich.repo import Repo

    with Repo(str(remote)) as repo:
        pack = tmp_path / "big.pack"
        with pack.open("wb") as out:
            repo.object_store.pack_loose_objects()
            (packed,) = repo.object_store.packs
            out.write(Path(packed.data.path).read_bytes())
    workspace, streamed = streamed_workspace(tmp_path, remote, pack, GitLimits(max_fetch_bytes=256 * 1024))

    # When a job reads the head, then Then it is refused once the pack passes the limit, long before its end
    with pytest.raises(
        PermanentJobError,
        match=r"went over the 262144-byte limit of MAX_FETCH_BYTES \(the template's MaxFetchBytes parameter\)",
    ):
        workspace.head()
    assert streamed.sent <= 256 * 1024 + 64 * 1024 < pack.stat().st_size
    print(f"\nreceived {streamed.sent} of {pack.stat().st_size} pack bytes before the refusal")


def test_a_delta_making_a_huge_object_is_refused_from_its_header(
    tmp_path: Path, make_remote: Callable[..., Path]
) -> None:
    # Given a pack of one small delta whose header says it makes a 1 GiB object
    remote = make_remote()
    delta = bytes([5]) + bytes([0x80, 0x80, 0x80, 0x80, 0x04]) + b"\x01\x00"  # base: 5 bytes; result: 1 GiB
    header = bytes(pack_object_header(REF_DELTA, b"\x11" * 20, len(delta), DEFAULT_OBJECT_FORMAT))
    pack = one_object_pack(tmp_path / "delta.pack", header, delta)
    workspace, _ = streamed_workspace(tmp_path, remote, pack, GitLimits())

    with pytest.raises(PermanentJobError, match=r"1073741824-byte git object.*MAX_BLOB_BYTES"):
        workspace.head()


def test_an_object_inflating_past_its_header_is_refused(tmp_path: Path, make_remote: Callable[..., Path]) -> None:
    # Given a pack whose one object says 10 bytes and inflates to 8 MiB
    remote = make_remote()
    header = bytes(pack_object_header(3, None, 10, DEFAULT_OBJECT_FORMAT))
    pack = one_object_pack(tmp_path / "liar.pack", header, bytes(8 * MIB))
    workspace, _ = streamed_workspace(tmp_path, remote, pack, GitLimits())

    with pytest.raises(PermanentJobError, match="larger than its header says"):
        workspace.head()


def test_a_checkout_stops_at_max_checkout_bytes(remote: Path, tmp_path: Path) -> None:
    folders = {path.rsplit("/", 1)[0] for path in SEED_FILES if "/" in path}
    entries = len(SEED_FILES) + len(folders)
    limit = sum(len(content) for content in SEED_FILES.values()) + entries * CHECKOUT_ENTRY_BYTES - 1
    store = GitWorkspaceStore(
        tmp_path / "caches",
        lambda ws: GitRemote(str(remote), f"agent/{ws}", BASE_BRANCH),
        limits=GitLimits(max_checkout_bytes=limit),
    )
    workspace = store.open("ws-1")

    with pytest.raises(PermanentJobError, match=rf"larger than the {limit}-byte limit of MAX_CHECKOUT_BYTES"):
        workspace.checkout(workspace.head(), tmp_path / "checkout")

    # One byte more and the same tree is checked out whole.
    roomy = GitWorkspaceStore(
        tmp_path / "caches-2",
        lambda ws: GitRemote(str(remote), f"agent/{ws}", BASE_BRANCH),
        limits=GitLimits(max_checkout_bytes=limit + 1),
    ).open("ws-1")
    roomy.checkout(roomy.head(), tmp_path / "whole")
    assert (tmp_path / "whole" / "README.md").read_bytes() == SEED_FILES["README.md"]


def test_objects_within_the_limits_are_fetched_from_a_local_remote(
    tmp_path: Path, make_remote: Callable[..., Path]
) -> None:
    # A file just under MAX_BLOB_BYTES is fetched: the limit is on size, not on the kind of remote
    remote = make_remote("sized", empty=True)
    commit_files(remote, BASE_BRANCH, {"data.bin": bytes(64 * 1024)}, "data\n")
    limits = GitLimits(max_blob_bytes=64 * 1024)
    store = GitWorkspaceStore(
        tmp_path / "caches", lambda ws: GitRemote(str(remote), f"agent/{ws}", BASE_BRANCH), limits=limits
    )
    job = apply_patch_job("job-1", NEW_FILE)
    assert apply_patch.run(job, JobContext(store.open("ws-1"), lambda: 60_000))["alreadyApplied"] is False

    # and one byte more is refused
    commit_files(remote, BASE_BRANCH, {"data.bin": bytes(64 * 1024 + 1)}, "more\n")
    tight = GitWorkspaceStore(
        tmp_path / "caches-2", lambda ws: GitRemote(str(remote), f"agent/{ws}", BASE_BRANCH), limits=limits
    )
    with pytest.raises(PermanentJobError, match="65537-byte git object"):
        tight.open("ws-2").head()


# Runs in a child process: THREADS jobs at once, as the worker runs the message groups of a batch, each reading the
# head of its own workspace and checking it out; every workspace's remote holds one large file within MAX_BLOB_BYTES.
CONCURRENT_CHILD = textwrap.dedent(
    """
    import json, sys, threading, time
    from pathlib import Path
    from job_worker.jobs.git import object_sizes
    from job_worker.jobs.git_workspace import GitRemote, GitWorkspaceStore

    root, threads = Path(sys.argv[1]), int(sys.argv[2])
    if sys.argv[3] == "unserialized":
        object_sizes.LARGE_OBJECT_BYTES = 1 << 62
    store = GitWorkspaceStore(root / "caches", lambda ws: GitRemote(str(root / f"{ws}.git"), f"agent/{ws}", "main"))
    start = threading.Barrier(threads)
    errors = []

    def job(n):
        try:
            workspace = store.open(f"ws-{n}")
            start.wait()
            workspace.checkout(workspace.head(), root / f"checkout-{n}")
        except Exception as error:
            errors.append(repr(error))

    started = time.monotonic()
    running = [threading.Thread(target=job, args=(n,)) for n in range(threads)]
    for thread in running:
        thread.start()
    for thread in running:
        thread.join()
    status = Path("/proc/self/status").read_text()
    peak = int(next(l for l in status.splitlines() if l.startswith("VmHWM:")).split()[1]) / 1024
    print(json.dumps({"errors": errors, "peak_mb": peak, "seconds": round(time.monotonic() - started, 3)}))
    """
)
CONCURRENT_JOBS = 4
LARGE_FILE_BYTES = 40 * MIB


def test_jobs_running_at_once_take_turns_with_large_objects(tmp_path: Path) -> None:
    # Given 4 workspaces, each a remote of one 40 MiB file (within MAX_BLOB_BYTES)
    for n in range(CONCURRENT_JOBS):
        zero_bomb_remote(tmp_path / f"ws-{n}.git", LARGE_FILE_BYTES)

    # When one worker runs a job of each at once (fetch and checkout)
    report = run_script(CONCURRENT_CHILD, str(tmp_path), str(CONCURRENT_JOBS), "serialized")
    print(
        f"\n{CONCURRENT_JOBS} jobs at once, each fetching and checking out a {LARGE_FILE_BYTES // MIB} MiB file:"
        f" peak RSS {report['peak_mb']:.1f} MB in {report['seconds']} s"
    )

    # Then all succeed, and the worker's memory holds about one large object's copies, not one per job
    assert report["errors"] == []
    for n in range(CONCURRENT_JOBS):
        assert (tmp_path / f"checkout-{n}" / "zeros.bin").stat().st_size == LARGE_FILE_BYTES
    assert report["peak_mb"] < PEAK_BOUND_MB


def test_a_pack_of_deltas_within_the_limits_is_received_whole(tmp_path: Path, make_remote: Callable[..., Path]) -> None:
    # Given a network remote whose pack holds deltas (two versions of a file), within every limit
    from dulwich.pack import DELTA_TYPES, PackData, write_pack_objects
    from dulwich.repo import Repo

    remote = make_remote()
    text = b"".join(b"line %d of a file that changes a little\n" % n for n in range(2000))
    first = commit_files(remote, BASE_BRANCH, {**SEED_FILES, "big.txt": text}, "one\n")
    commit_files(remote, BASE_BRANCH, {**SEED_FILES, "big.txt": text + b"one more\n"}, "two\n", parents=[first])
    pack = tmp_path / "deltas.pack"
    with Repo(str(remote)) as repo, pack.open("wb") as out:
        objects = [repo.object_store[sha] for sha in repo.object_store]
        write_pack_objects(out, objects, object_format=DEFAULT_OBJECT_FORMAT, deltify=True)
    with PackData(str(pack), object_format=DEFAULT_OBJECT_FORMAT) as data:
        assert any(entry.pack_type_num in DELTA_TYPES for entry in data.iter_unpacked())
    limits = GitLimits(max_blob_bytes=len(text) + 64, max_fetch_bytes=pack.stat().st_size)
    workspace, streamed = streamed_workspace(tmp_path, remote, pack, limits)

    # When a job reads the head, Then the whole pack is received and the branch's files are there
    head = workspace.head()
    assert streamed.sent == pack.stat().st_size
    workspace.checkout(head, tmp_path / "checkout")
    assert (tmp_path / "checkout" / "big.txt").read_bytes() == text + b"one more\n"


def test_a_zero_bomb_behind_a_local_remotes_alternates_is_refused_in_bounded_memory(
    tmp_path: Path, make_remote: Callable[..., Path]
) -> None:
    # Given a local remote that holds no objects of its own but borrows them from another (objects/info/alternates),
    # whose branch holds a 200 MiB file of zeros
    from dulwich.repo import Repo

    bomb = zero_bomb_remote(tmp_path / "bomb.git", BOMB_BYTES)
    borrower = tmp_path / "borrower.git"
    Repo.init_bare(str(borrower), mkdir=True, default_branch=BASE_BRANCH.encode()).close()
    (borrower / "objects" / "info" / "alternates").write_text(f"{bomb / 'objects'}\n")
    (borrower / "refs" / "heads" / BASE_BRANCH).write_text((bomb / "refs" / "heads" / BASE_BRANCH).read_text())

    # When a worker runs a job of its workspace, then one of another workspace
    report = run_child(borrower, make_remote("other"), tmp_path / "caches", "local")
    print(f"\nalternates: peak RSS {report['peak_mb']:.1f} MB, the bomb's job took {report['seconds']} s")

    # Then the bomb is refused before the sending side inflates it, and the other job succeeds
    assert report["bomb"].startswith("PermanentJobError: ")
    assert "MAX_BLOB_BYTES" in report["bomb"]
    assert report["peak_mb"] < PEAK_BOUND_MB
    assert report["other"]["alreadyApplied"] is False


def test_a_checkout_of_countless_empty_files_stops_at_max_checkout_bytes(
    tmp_path: Path, make_remote: Callable[..., Path]
) -> None:
    # Given a branch of 2000 empty files: no content, but 2000 files to write
    remote = make_remote("empty-files", empty=True)
    commit_files(remote, BASE_BRANCH, {f"f/{n}": b"" for n in range(2000)}, "many\n")
    store = GitWorkspaceStore(
        tmp_path / "caches",
        lambda ws: GitRemote(str(remote), f"agent/{ws}", BASE_BRANCH),
        limits=GitLimits(max_checkout_bytes=100 * 1024),
    )
    workspace = store.open("ws-1")

    with pytest.raises(PermanentJobError, match="MAX_CHECKOUT_BYTES"):
        workspace.checkout(workspace.head(), tmp_path / "checkout")
    assert len(list((tmp_path / "checkout" / "f").iterdir())) < 100 * 1024 // CHECKOUT_ENTRY_BYTES
