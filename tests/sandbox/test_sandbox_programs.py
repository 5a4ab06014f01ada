"""The in-sandbox programs (rlpipe/sandbox/programs/) as modules: the shared tree and IPC
wipes, docker's wipe, upload framing and tar, exercised on temporary dirs on the host.

The IPC removal runs in a child in an IPC namespace of its own (`unshare`), so the host's
System V objects are never touched; it is skipped where unshare cannot make one.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rlpipe.sandbox.programs import cleanup, docker_work, program_source
from rlpipe.sandbox.warm_python import SERVER_SOURCE


def _deep_tree(top: Path, depth: int) -> Path:
    """A chain of `depth` nested dirs under `top` (made one at a time), a file at the bottom."""
    path = str(top)
    os.makedirs(path, exist_ok=True)
    for _ in range(depth):
        path += "/d"
        os.mkdir(path)
    with open(path + "/leaf", "wb") as leaf:
        leaf.write(b"x")
    return top


def test_remove_tree_deletes_a_tree_deeper_than_the_recursion_limit(tmp_path):
    depth = sys.getrecursionlimit() + 100  # a recursive walk would fail; the iterative one must not
    tree = _deep_tree(tmp_path / "tree", depth)
    (tmp_path / "tree" / "locked").mkdir()
    (tmp_path / "tree" / "locked" / "f").write_bytes(b"y")
    os.chmod(tmp_path / "tree" / "locked", 0)  # a command may take the permissions away
    assert cleanup.remove_tree(str(tree)) is True
    assert not tree.exists()


def test_remove_tree_unlinks_a_symlink_to_a_dir_without_following_it(tmp_path):
    target = tmp_path / "kept"
    target.mkdir()
    (target / "inside").write_bytes(b"z")
    link = tmp_path / "link"
    link.symlink_to(target)
    assert cleanup.remove_tree(str(link)) is True
    assert not link.is_symlink() and (target / "inside").read_bytes() == b"z"


def test_empty_dir_keeps_the_dir_zeroes_its_times_and_tolerates_a_missing_one(tmp_path):
    top = tmp_path / "scratch"
    _deep_tree(top / "nested", 50)
    (top / "file").write_bytes(b"1")
    assert cleanup.empty_dir(str(top)) is True
    assert top.is_dir() and os.listdir(top) == []
    assert top.stat().st_mtime_ns == 0
    assert cleanup.empty_dir(str(tmp_path / "missing")) is True


def test_docker_wipe_restores_the_work_root_and_empties_the_dirs(tmp_path, monkeypatch):
    work, scratch = tmp_path / "work", tmp_path / "tmp"
    _deep_tree(work / "deep", 200)
    (scratch / "sub").mkdir(parents=True)
    (scratch / "sub" / "f").write_bytes(b"2")
    os.chmod(work, 0o755)
    monkeypatch.setattr(docker_work, "remove_ipc_objects", lambda: [])  # the real one: test below, in a namespace
    assert docker_work.wipe([str(work), str(scratch)], work=str(work)) == []
    assert os.listdir(work) == [] and os.listdir(scratch) == []
    assert (work.stat().st_mode & 0o7777, work.stat().st_mtime_ns) == (0o700, 0)


def test_docker_wipe_reports_what_it_could_not_empty(tmp_path, monkeypatch):
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.setattr(docker_work, "remove_ipc_objects", lambda: ["/proc/sysvipc/shm"])
    not_a_dir = tmp_path / "file"
    not_a_dir.write_bytes(b"")
    left = docker_work.wipe([str(not_a_dir)], work=str(work))
    assert left == [f"{not_a_dir} could not be emptied", "System V IPC objects left in /proc/sysvipc/shm"]


def test_unpack_writes_the_framed_files_and_replaces_a_symlink_in_the_way(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    outside = tmp_path / "outside"
    outside.write_bytes(b"keep")
    (work / "a.txt").symlink_to(outside)
    docker_work.unpack(docker_work.frames({"a.txt": b"new", "pkg/mod.py": b"V = 1\n", "empty": b""}), work=str(work))
    assert (work / "a.txt").read_bytes() == b"new" and not (work / "a.txt").is_symlink()
    assert outside.read_bytes() == b"keep"
    assert (work / "pkg" / "mod.py").read_bytes() == b"V = 1\n" and (work / "empty").read_bytes() == b""


def test_tar_then_untar_gives_the_same_files(tmp_path):
    source, target = tmp_path / "source", tmp_path / "target"
    (source / "dir").mkdir(parents=True)
    (source / "dir" / "f").write_bytes(b"data")
    (source / "top").write_bytes(b"t")
    stream = io.BytesIO()
    docker_work.write_tar(stream, work=str(source))
    stream.seek(0)
    target.mkdir()
    docker_work.read_tar(stream, work=str(target))
    assert (target / "dir" / "f").read_bytes() == b"data" and (target / "top").read_bytes() == b"t"


def test_programs_sent_into_sandboxes_hold_one_copy_of_the_wipes():
    wipes = program_source("programs/cleanup.py")
    assert SERVER_SOURCE.startswith(wipes) and SERVER_SOURCE.count("def remove_tree(") == 1
    docker = program_source("programs/cleanup.py", "programs/docker_work.py")
    assert docker.startswith(wipes) and docker.count("def remove_ipc_objects(") == 1
    for text in (SERVER_SOURCE, docker, program_source("programs/docker_init.py")):
        compile(text, "<sandbox program>", "exec")  # what `python3 -c` does first


_IPC_CHILD = """
import ctypes, json, sys
from rlpipe.sandbox.programs import cleanup
libc = ctypes.CDLL(None, use_errno=True)
IPC_CREAT = 0o1000
made = [libc.shmget(0x51, 1 << 20, IPC_CREAT | 0o600), libc.msgget(0x52, IPC_CREAT | 0o600),
        libc.semget(0x53, 1, IPC_CREAT | 0o600)]
before = {table: len(cleanup.ipc_ids(table)) for table in cleanup.SYSV_IPC_TABLES}
left = cleanup.remove_ipc_objects()
after = {table: len(cleanup.ipc_ids(table)) for table in cleanup.SYSV_IPC_TABLES}
print(json.dumps({"made": made, "before": before, "left": left, "after": after}))
"""


def test_remove_ipc_objects_removes_every_kind_in_a_fresh_ipc_namespace():
    argv = ["unshare", "--user", "--map-root-user", "--ipc", sys.executable, "-c", _IPC_CHILD]
    try:
        probe = subprocess.run(argv[:4] + ["true"], capture_output=True, timeout=30)
    except FileNotFoundError:
        pytest.skip("no unshare here")
    if probe.returncode != 0:
        pytest.skip(f"unshare cannot make an IPC namespace here: {probe.stderr.decode(errors='replace')[-200:]}")
    result = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=True,
                            env={**os.environ, "PYTHONPATH": str(Path(cleanup.__file__).parents[3])})
    report = json.loads(result.stdout)
    assert all(ident >= 0 for ident in report["made"])
    # the namespace is fresh: exactly the one object of each kind made above, then none
    assert list(report["before"].values()) == [1, 1, 1]
    assert report["left"] == [] and list(report["after"].values()) == [0, 0, 0]
