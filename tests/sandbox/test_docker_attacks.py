"""One adversarial property per test for the docker sandbox backend.

Each test starts its own sandbox (about 0.5 s) so no attack can leave state for the next.
Network tests only ever talk to a listener on this machine's 127.0.0.1.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from rlpipe.core.errors import SandboxUnavailable
from rlpipe.sandbox.base import Limits
from tests.helpers.docker_engine import require_docker_engine

pytestmark = pytest.mark.docker

REPO_ROOT = Path(__file__).resolve().parents[2]


def _docker_or_skip():
    return require_docker_engine()


@pytest.fixture
def make_sandbox():
    _docker_or_skip()
    from rlpipe.sandbox.docker_backend import DockerSandbox

    sandboxes = []

    def make(**limits):
        sandbox = DockerSandbox(Limits(**limits))
        sandboxes.append(sandbox)
        return sandbox

    yield make
    for sandbox in sandboxes:
        sandbox.close()


def python(code: str) -> list[str]:
    return ["python3", "-c", textwrap.dedent(code)]


def sandbox_pids(sandbox) -> list[int]:
    """The live processes inside, besides PID 1 (the reaper) and the lister itself. A zombie
    (state Z: killed, not yet reaped by PID 1, which a loaded machine may delay) runs nothing
    and is not counted."""
    result = sandbox.exec(python("""
        import os
        def live(pid):
            try:
                return open(f'/proc/{pid}/stat').read().rsplit(')', 1)[1].split()[0] != 'Z'
            except OSError:
                return False
        print(' '.join(p for p in os.listdir('/proc')
                       if p.isdigit() and int(p) not in (1, os.getpid(), os.getppid()) and live(p)))
    """))
    return [int(pid) for pid in result.stdout.split()]


def test_fork_bomb_is_contained_and_sandbox_recovers(make_sandbox):
    sandbox = make_sandbox(max_processes=32, timeout_s=3)
    started = time.monotonic()
    result = sandbox.exec(python("""
        import os
        while True:
            try:
                os.fork()
            except OSError:
                pass
    """))
    assert time.monotonic() - started < 20
    assert result.timed_out or result.exit_code != 0
    assert sandbox.exec(["sh", "-c", "echo alive"]).stdout == "alive\n"


def test_memory_bomb_is_oom_killed(make_sandbox):
    sandbox = make_sandbox(memory_mb=128)
    result = sandbox.exec(python("chunks = [bytearray(16 * 2**20) for _ in range(1000)]"))
    assert result.oom_killed
    assert result.exit_code != 0


def test_disk_fill_stops_at_the_work_dir_size(make_sandbox):
    sandbox = make_sandbox(disk_mb=16, memory_mb=256)
    result = sandbox.exec(python("""
        import errno
        written = 0
        try:
            with open('fill', 'wb') as f:
                while True:
                    f.write(b'x' * 2**20); f.flush(); written += 2**20
        except OSError as exc:
            print(written, exc.errno == errno.ENOSPC)
    """))
    written, no_space = result.stdout.split()
    assert int(written) <= 16 * 2**20 and no_space == "True"


def test_infinite_loop_times_out(make_sandbox):
    sandbox = make_sandbox()
    result = sandbox.exec(python("while True: pass"), timeout_s=1.0)
    assert result.timed_out and result.exit_code is None
    assert result.duration_s < 3.0


def test_sleep_forever_times_out_and_work_dir_survives(make_sandbox):
    sandbox = make_sandbox()
    sandbox.write_files({"keep.txt": b"kept"})
    result = sandbox.exec(python("import time; time.sleep(10**6)"), timeout_s=1.0)
    assert result.timed_out
    assert sandbox.read_file("keep.txt") == b"kept"
    assert sandbox_pids(sandbox) == []


def test_host_loopback_listener_is_unreachable(make_sandbox):
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    port = listener.getsockname()[1]
    try:
        sandbox = make_sandbox()
        result = sandbox.exec(python(f"""
            import socket
            try:
                socket.create_connection(('127.0.0.1', {port}), timeout=2); print('connected')
            except OSError as exc:
                print('refused', type(exc).__name__)
        """))
        assert result.stdout.startswith("refused")
        listener.settimeout(0.2)
        with pytest.raises(TimeoutError):
            listener.accept()
    finally:
        listener.close()


def test_no_network_interface_but_loopback(make_sandbox):
    sandbox = make_sandbox()
    result = sandbox.exec(python("import socket; print(sorted(name for _, name in socket.if_nameindex()))"))
    assert result.stdout.strip() == "['lo']"


def test_writes_outside_the_work_dir_fail(make_sandbox):
    sandbox = make_sandbox()
    result = sandbox.exec(python("""
        for path in ['/etc/evil', '/usr/evil', '/evil', '/root/evil', '/usr/bin/python3', '/etc/passwd']:
            try:
                open(path, 'a').write('x'); print('WROTE', path)
            except OSError:
                pass
        print('done')
    """))
    assert result.stdout == "done\n"


def test_host_files_are_not_visible(make_sandbox):
    sandbox = make_sandbox()
    secrets = [str(REPO_ROOT / "pyproject.toml"), str(Path(__file__).resolve()), "/root/.bashrc", "/etc/shadow", sys.executable]
    result = sandbox.exec(python(f"""
        import os
        for path in {secrets!r}:
            if os.path.exists(path):
                print('VISIBLE', path)
        print(os.access('/root', os.R_OK), 'done')
    """))
    assert result.stdout == "False done\n"


def test_host_environment_is_not_inherited(make_sandbox):
    os.environ["RLPIPE_TEST_SECRET"] = "hunter2"
    try:
        sandbox = make_sandbox()
        result = sandbox.exec(python("import os; print(sorted(os.environ))"))
    finally:
        del os.environ["RLPIPE_TEST_SECRET"]
    assert "hunter2" not in result.stdout
    assert eval(result.stdout) == ["HOME", "HOSTNAME", "PATH", "PWD"]


def test_100mb_of_stdout_is_capped(make_sandbox):
    sandbox = make_sandbox(output_bytes=100_000, timeout_s=60)
    result = sandbox.exec(python("""
        import sys
        block = 'x' * 2**20
        for _ in range(100):
            sys.stdout.write(block)
    """))
    assert result.exit_code == 0
    assert len(result.stdout) == 100_000 and result.stdout_truncated


def test_double_fork_does_not_outlive_the_command_or_the_sandbox(make_sandbox):
    docker_client = _docker_or_skip()
    sandbox = make_sandbox()
    sandbox.exec(python("""
        import os, time
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                time.sleep(10**6)
            os._exit(0)
    """))
    assert sandbox_pids(sandbox) == []
    container_id = sandbox._container_id
    sandbox.close()
    ids = [c.id for c in docker_client.containers.list(all=True, filters={"label": "rlpipe.sandbox=1"}, ignore_removed=True)]
    assert container_id not in ids


@pytest.mark.parametrize("code", ["import sys; sys.exit({n})", "import os; os._exit({n})"])
def test_exit_codes_are_exact(make_sandbox, code):
    sandbox = make_sandbox()
    for n in (0, 1, 3, 42, 255):
        assert sandbox.exec(["python3", "-c", code.format(n=n)]).exit_code == n


def test_leaked_containers_of_a_dead_process_are_removed():
    _docker_or_skip()
    from rlpipe.sandbox.docker_backend import remove_leaked_containers

    creator = subprocess.run(
        [sys.executable, "-c", "from rlpipe.sandbox.docker_backend import DockerSandbox; "
         "from rlpipe.sandbox.base import Limits; import os; s = DockerSandbox(Limits()); "
         "print(s._container_id, flush=True); os._exit(0)"],
        capture_output=True, text=True, timeout=60, cwd=REPO_ROOT,
    )
    leaked_id = creator.stdout.strip()
    assert leaked_id, creator.stderr
    assert remove_leaked_containers() >= 1
    from rlpipe.sandbox.docker_backend import docker_client

    ids = [c.id for c in docker_client().containers.list(all=True, filters={"label": "rlpipe.sandbox=1"}, ignore_removed=True)]
    assert leaked_id not in ids


def test_no_engine_raises_sandbox_unavailable_with_a_hint(tmp_path):
    from rlpipe.sandbox.docker_backend import DockerSandbox

    with pytest.raises(SandboxUnavailable) as caught:
        DockerSandbox(Limits(), base_url=f"unix://{tmp_path}/no-docker.sock")
    assert "dockerd" in caught.value.hint
