"""Snapshots and restores cost what the work dir holds, not what its files claim (issue 31, item 3).

An agent can make sparse files (`truncate -s`: an apparent size, no blocks) and hard links;
a dense copy of them would fill the host's disk (bubblewrap) or the controller's memory
(docker). Each backend test makes 50 sparse files of the disk limit's size each, one file
with data inside holes, and a hard link, then snapshots and restores: the snapshot's
allocated blocks on the host (os.stat st_blocks) stay far below the apparent size, this
process's peak RSS does not grow by it, and the restored files have their sizes, data,
holes and link. Refusals are AgentStateError (the agent's failure, not infrastructure).
"""

from __future__ import annotations

import os
import resource
import textwrap
from pathlib import Path

import pytest

from rlpipe.core.errors import AgentStateError, InfraError, SandboxUnavailable
from rlpipe.sandbox.base import Limits
from tests.sandbox._bwrap_support import require_bwrap

DISK_MB = 64
SPARSE_FILES = 50
APPARENT_BYTES = SPARSE_FILES * DISK_MB * 1024 * 1024  # 3.2 GiB
SMALL_BYTES = 8 * 1024 * 1024  # far below the apparent size, far above what the tree holds

MAKE_TREE = textwrap.dedent(f"""
    import os
    os.makedirs("deep/er", exist_ok=True)
    for i in range({SPARSE_FILES}):
        os.truncate(os.open(f"deep/er/sparse{{i}}", os.O_CREAT | os.O_WRONLY, 0o644), {DISK_MB * 1024 * 1024})
    with open("mixed", "wb") as f:
        f.seek(10 * 1024 * 1024)
        f.write(b"x" * 5000)
        f.truncate(20 * 1024 * 1024)
    open("small", "w").write("data")
    os.link("small", "hard")
    os.symlink("small", "soft")
""")

CHECK_TREE = textwrap.dedent(f"""
    import os
    sizes = {{os.stat(f"deep/er/sparse{{i}}").st_size for i in range({SPARSE_FILES})}}
    blocks = sum(os.stat(f"deep/er/sparse{{i}}").st_blocks for i in range({SPARSE_FILES}))
    with open("mixed", "rb") as f:
        f.seek(10 * 1024 * 1024 - 1)
        middle = f.read(5002)
    print(sizes == {{{DISK_MB * 1024 * 1024}}}, blocks == 0, os.stat("mixed").st_size == 20 * 1024 * 1024,
          middle == b"\\0" + b"x" * 5000 + b"\\0", os.stat("mixed").st_blocks * 512 < 1024 * 1024,
          os.stat("small").st_ino == os.stat("hard").st_ino, open("hard").read() == "data",
          os.readlink("soft") == "small")
""")
ALL_TRUE = " ".join(["True"] * 8) + "\n"


def allocated_bytes(path: Path) -> int:
    """Bytes the files under `path` occupy on disk (st_blocks, each inode once), not their apparent sizes."""
    blocks = {os.lstat(path).st_ino: os.lstat(path).st_blocks}
    for directory, dirs, files in os.walk(path):
        for name in dirs + files:
            status = os.lstat(os.path.join(directory, name))
            blocks[status.st_ino] = status.st_blocks
    return sum(blocks.values()) * 512


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def snapshot_restore_and_check(sandbox, snapshot_location) -> None:
    made = sandbox.exec(["python3", "-c", MAKE_TREE])
    assert made.exit_code == 0, made.stderr
    rss_before = peak_rss_bytes()
    snapshot = sandbox.snapshot()
    assert allocated_bytes(snapshot_location(snapshot)) < SMALL_BYTES
    sandbox.exec(["sh", "-c", "rm -rf deep mixed small hard soft; echo later > other"])
    sandbox.restore(snapshot)
    assert peak_rss_bytes() - rss_before < SMALL_BYTES * 4  # the tree claims 3.2 GiB
    checked = sandbox.exec(["python3", "-c", CHECK_TREE])
    assert checked.stdout == ALL_TRUE, checked.stderr
    assert sandbox.exec(["sh", "-c", "test -e other"]).exit_code == 1


@pytest.mark.bwrap
def test_bwrap_snapshots_keep_sparse_files_sparse_and_links_linked():
    require_bwrap()
    from rlpipe.sandbox.bwrap import BwrapSandbox

    with BwrapSandbox(Limits(timeout_s=60, disk_mb=DISK_MB)) as sandbox:
        snapshot_restore_and_check(sandbox, lambda snapshot: sandbox.runtime_root / "snapshots" / snapshot.snapshot_id)


@pytest.mark.docker
def test_docker_snapshots_stream_sparse_files_to_a_small_file_on_disk():
    from rlpipe.sandbox.docker_backend import DockerSandbox

    try:
        sandbox = DockerSandbox(Limits(timeout_s=60, disk_mb=DISK_MB))
    except SandboxUnavailable as exc:
        pytest.skip(f"no docker engine: {exc.message}")
    try:
        snapshot_restore_and_check(sandbox, lambda snapshot: sandbox.work_dir.snapshots.path(snapshot.snapshot_id))
        snapshot_dir = sandbox.work_dir.snapshots.dir
    finally:
        sandbox.close()
    assert not snapshot_dir.exists()  # close() removes the sandbox's snapshots


@pytest.mark.docker
def test_a_docker_work_dir_the_snapshot_cannot_read_is_the_agents_failure():
    from rlpipe.sandbox.docker_backend import DockerSandbox

    try:
        sandbox = DockerSandbox(Limits(timeout_s=20))
    except SandboxUnavailable as exc:
        pytest.skip(f"no docker engine: {exc.message}")
    try:
        sandbox.exec(["sh", "-c", "mkdir locked && echo secret > locked/f && chmod 000 locked"])
        with pytest.raises(AgentStateError) as caught:
            sandbox.snapshot()
        assert not isinstance(caught.value, InfraError)
        assert "cannot be archived" in caught.value.message and "PermissionError" in caught.value.message
        assert list(sandbox.work_dir.snapshots.dir.iterdir()) == []  # the partial tar is gone
    finally:
        sandbox.close()


def test_a_tree_holding_more_data_than_the_disk_limit_is_refused_and_leaves_no_copy(tmp_path):
    from rlpipe.sandbox.bwrap_workdir import save_snapshot

    work = tmp_path / "work"
    work.mkdir()
    for name in ("a", "b"):  # 2 MiB of real data against a 1 MB limit (a plain work dir, bounded per file only)
        (work / name).write_bytes(os.urandom(1024 * 1024))
    target = tmp_path / "snapshot"
    with pytest.raises(AgentStateError) as caught:
        save_snapshot(work, target, disk_mb=1)
    assert not isinstance(caught.value, InfraError)
    assert "more than 1 MiB of data" in caught.value.message
    assert not target.exists()


def test_hard_links_count_once_against_the_budget(tmp_path):
    from rlpipe.sandbox.bwrap_workdir import save_snapshot

    work = tmp_path / "work"
    work.mkdir()
    (work / "data").write_bytes(os.urandom(512 * 1024))
    for i in range(20):  # 20 names, one inode: 10 MiB if each were copied
        os.link(work / "data", work / f"link{i}")
    save_snapshot(work, tmp_path / "snapshot", disk_mb=1)
    inodes = {os.stat(path).st_ino for path in (tmp_path / "snapshot").iterdir()}
    assert len(inodes) == 1 and allocated_bytes(tmp_path / "snapshot") < 2 * 1024 * 1024
