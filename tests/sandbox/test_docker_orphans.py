"""A `kill -9`ed process's docker sandbox containers are removed by the next process that opens one (issue 31, item 6).

Real processes and a real engine: a child opens a DockerSandbox, says its container id
(the container exists once the line arrives: no sleep), and is SIGKILLed; a second child
stays alive. Opening a sandbox in this process, as the first one of a fresh process would
(the once-per-process flag cleared), removes the orphan and leaves the live owners' ones.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from rlpipe.core.errors import SandboxUnavailable
from rlpipe.sandbox.base import Limits

pytestmark = pytest.mark.docker

REPO_ROOT = Path(__file__).resolve().parents[2]
OWNER = """
import sys
from rlpipe.sandbox.base import Limits
from rlpipe.sandbox.docker_backend import DockerSandbox
sandbox = DockerSandbox(Limits(), run_id=sys.argv[1])
print(sandbox._container_id, flush=True)
sys.stdin.readline()  # until told to go (or killed)
sandbox.close()
"""


def _client():
    from rlpipe.sandbox.docker_backend import docker_client

    try:
        return docker_client()
    except SandboxUnavailable as exc:
        pytest.skip(f"no docker engine: {exc.message}")


def _start_owner(run_id: str) -> tuple[subprocess.Popen[str], str]:
    """A child process holding one sandbox; returns it once its container exists."""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    child = subprocess.Popen([sys.executable, "-c", OWNER, run_id], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, cwd=REPO_ROOT, env=env)
    container_id = child.stdout.readline().strip()
    assert container_id, child.stderr.read() if child.poll() is not None else "no container id"
    return child, container_id


def _exists(client, container_id: str) -> bool:
    import docker.errors

    try:
        client.api.inspect_container(container_id)
    except docker.errors.NotFound:
        return False
    return True


def test_the_next_sandbox_opened_removes_a_killed_owners_container_and_spares_live_ones(monkeypatch):
    client = _client()
    from rlpipe.sandbox import docker_owners
    from rlpipe.sandbox.docker_backend import DockerSandbox

    killed, orphan_id = _start_owner("eval-killed")
    alive, alive_id = _start_owner("eval-alive")
    own = DockerSandbox(Limits())
    try:
        labels = client.api.inspect_container(orphan_id)["Config"]["Labels"]
        assert labels["rlpipe.run_id"] == "eval-killed" and labels["rlpipe.pid"] == str(killed.pid)
        assert labels["rlpipe.pid_start"].isdigit()
        killed.send_signal(signal.SIGKILL)
        killed.wait()
        assert client.api.inspect_container(orphan_id)["State"]["Running"]  # the leak: kill -9 leaves it

        monkeypatch.setattr(docker_owners, "_reaped", set())  # as in a fresh process
        DockerSandbox(Limits()).close()

        assert not _exists(client, orphan_id)
        assert _exists(client, alive_id) and _exists(client, own._container_id)
        assert own.exec(["sh", "-c", "echo still here"]).stdout == "still here\n"
    finally:
        own.close()
        alive.communicate("go\n", timeout=60)
        killed.stdout.close()
        killed.stderr.close()
    assert not _exists(client, alive_id)  # its owner closed it


def test_a_container_whose_pid_now_belongs_to_another_process_is_an_orphan():
    client = _client()
    from rlpipe.sandbox.docker_owners import owner_labels, remove_leaked_containers
    from rlpipe.sandbox.image import ensure_image

    labels = {**owner_labels(), "rlpipe.pid_start": "1"}  # this pid, but a process started at another time
    container = client.containers.run(ensure_image(client), command=["sleep", "600"], detach=True, labels=labels,
                                      network_mode="none", user="1000:1000")
    try:
        assert remove_leaked_containers() >= 1
        assert not _exists(client, container.id)
    finally:
        if _exists(client, container.id):
            container.remove(force=True)


def test_a_command_that_opens_no_docker_sandbox_still_removes_a_killed_evals_container(tmp_path):
    """`rlpipe verify` on bubblewrap (no docker sandbox of its own) removes, in the background,
    the container a kill -9ed eval left: the next command cleans up whatever its backend."""
    client = _client()
    from tests.cli.cli_process import run_rlpipe
    from tests.helpers.waiting import wait_until
    from tests.sandbox._bwrap_support import require_bwrap

    require_bwrap()
    killed, orphan_id = _start_owner("eval-killed-before-verify")
    killed.send_signal(signal.SIGKILL)
    killed.wait()
    assert _exists(client, orphan_id)
    completions = tmp_path / "completions.jsonl"
    completions.write_text('{"task_id": "arithmetic-0", "completion": "2"}\n')
    run_rlpipe(["verify", "arithmetic", "--completions", str(completions)], cwd=tmp_path, timeout_s=120)
    wait_until(lambda: not _exists(client, orphan_id), "the orphaned container to be removed", limit_s=60)
