"""BwrapSandbox behaviour beyond the attacks: files in and out, stdin, snapshots, reset, errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlpipe.core.errors import SandboxUnavailable
from rlpipe.sandbox.base import Limits
from tests.sandbox._bwrap_support import require_bwrap

pytestmark = pytest.mark.bwrap


@pytest.fixture
def sandbox():
    require_bwrap()
    from rlpipe.sandbox.bwrap import BwrapSandbox

    with BwrapSandbox(Limits(timeout_s=10, output_bytes=1000)) as made:
        yield made


def test_files_written_before_a_run_are_seen_inside_and_outputs_read_after(sandbox):
    sandbox.write_files({"solution.py": b"print(6 * 7)", "tests/data.txt": b"x"})
    result = sandbox.exec(["sh", "-c", "python3 solution.py > out.txt; ls tests"])
    assert result.exit_code == 0 and result.stdout == "data.txt\n"
    assert sandbox.read_file("out.txt") == b"42\n"


def test_stdin_reaches_the_command(sandbox):
    result = sandbox.exec(["python3", "-c", "import sys; print(len(sys.stdin.buffer.read()))"], stdin=b"a" * 300_000)
    assert result.stdout == "300000\n"


def test_stderr_is_capped_separately(sandbox):
    result = sandbox.exec(["python3", "-c", "import sys; sys.stderr.write('e' * 5000); print('ok')"])
    assert result.stdout == "ok\n" and not result.stdout_truncated
    assert result.stderr == "e" * 1000 and result.stderr_truncated


def test_restore_rolls_back_to_the_snapshot_any_number_of_times(sandbox):
    sandbox.write_files({"state.txt": b"initial"})
    snapshot = sandbox.snapshot()
    for attempt in range(3):
        sandbox.exec(["sh", "-c", f"echo {attempt} > state.txt; touch junk-{attempt}"])
        sandbox.restore(snapshot)
        assert sandbox.read_file("state.txt") == b"initial"
        assert sandbox.exec(["ls"]).stdout == "state.txt\n"


def test_restored_files_belong_to_the_sandbox_user(sandbox):
    sandbox.write_files({"dir/file.txt": b"v1"})
    snapshot = sandbox.snapshot()
    sandbox.restore(snapshot)
    assert sandbox.exec(["sh", "-c", "echo v2 > dir/file.txt && cat dir/file.txt"]).stdout == "v2\n"


def test_reset_empties_the_work_dir(sandbox):
    sandbox.write_files({"a.txt": b"1"})
    sandbox.reset()
    assert sandbox.exec(["ls", "-A"]).stdout == ""


def test_paths_must_stay_inside_the_work_dir(sandbox):
    for bad in ("../escape", "/etc/passwd", "a/../../b"):
        with pytest.raises(ValueError):
            sandbox.write_files({bad: b"x"})


def test_a_missing_file_is_file_not_found(sandbox):
    with pytest.raises(FileNotFoundError):
        sandbox.read_file("nothing-here")


def test_the_host_python_runs_inside(sandbox):
    result = sandbox.exec(["python3", "-c", "import json, sys; print(sys.version_info[:2] >= (3, 8))"])
    assert result.stdout == "True\n", result.stderr


def test_close_removes_the_sandbox_dir():
    require_bwrap()
    from rlpipe.sandbox.bwrap import BwrapSandbox

    sandbox = BwrapSandbox(Limits())
    directory = sandbox.dir
    sandbox.close()
    sandbox.close()  # twice is fine
    assert not directory.exists()


def test_missing_bwrap_is_sandbox_unavailable_with_a_hint(monkeypatch, tmp_path: Path):
    from rlpipe.sandbox.bwrap import BwrapSandbox

    monkeypatch.setenv("PATH", str(tmp_path))  # an empty dir: no bwrap, no prlimit
    with pytest.raises(SandboxUnavailable) as raised:
        BwrapSandbox(Limits())
    assert "apt-get install" in raised.value.hint


def test_network_true_shares_the_host_network():
    require_bwrap()
    import socket

    from rlpipe.sandbox.bwrap import BwrapSandbox

    with socket.socket() as listener, BwrapSandbox(Limits(network=True)) as sandbox:
        listener.bind(("127.0.0.1", 0))  # loopback only: tests never reach beyond this machine
        listener.listen(1)
        port = listener.getsockname()[1]
        result = sandbox.exec(["python3", "-c", f"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=2)"])
    assert result.exit_code == 0, result.stderr


def test_several_sandboxes_fork_from_one_snapshot():
    require_bwrap()
    from rlpipe.sandbox.bwrap import BwrapSandbox

    with BwrapSandbox(Limits()) as origin, BwrapSandbox(Limits()) as first, BwrapSandbox(Limits()) as second:
        origin.write_files({"repo/state.txt": b"initial"})
        snapshot = origin.snapshot()
        for index, sandbox in enumerate((first, second)):
            sandbox.restore(snapshot)
            sandbox.exec(["sh", "-c", f"echo {index} >> repo/state.txt"])
        assert first.read_file("repo/state.txt") == b"initial0\n" and second.read_file("repo/state.txt") == b"initial1\n"
        assert origin.read_file("repo/state.txt") == b"initial"
