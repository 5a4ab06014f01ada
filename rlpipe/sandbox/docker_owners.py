"""Which process owns each docker sandbox container, and the removal of containers whose owner is gone.

Every container the docker backend starts carries the labels `rlpipe.sandbox=1`,
`rlpipe.host` (this host's name), `rlpipe.pid` and `rlpipe.pid_start` (the creating
process and its start time, owner.py), and `rlpipe.run_id` when the caller passes one (an
eval's or a training run's id: it says whose containers they are, it does not decide
removal). A container whose owner on this host no longer runs (the pid is gone, or now
belongs to a process started at another time) is an orphan: a `kill -9` of an eval or a
crash leaves its in-flight containers running.

`reap_once` runs `remove_leaked_containers` (and removes the orphaned snapshot dirs,
docker_snapshots.py) the first time a process opens a docker sandbox on an engine, whatever
the command (eval, --resume, train, qa, verify); `rlpipe sandbox selftest` and the sandbox
pools call `remove_leaked_containers` themselves.

What it does not do: remove a container whose owner runs, or (without `all_hosts`) one made
from another host, whose pids mean nothing here. A container labelled by an older rlpipe
(no `rlpipe.pid_start`) is judged by its pid alone.
"""

from __future__ import annotations

import logging
import os
import socket
import threading

from rlpipe.sandbox.docker_engine import docker_client
from rlpipe.sandbox.docker_snapshots import remove_leaked_snapshot_dirs
from rlpipe.sandbox.owner import process_alive, this_process

LABEL = "rlpipe.sandbox"
log = logging.getLogger(__name__)
_reaped_lock = threading.Lock()
_reaped: set[str | None] = set()  # the engines this process has reaped on


def owner_labels(run_id: str | None = None) -> dict[str, str]:
    """The labels of a container this process starts."""
    pid, ticks = this_process()
    labels = {LABEL: "1", "rlpipe.host": socket.gethostname(), "rlpipe.pid": str(pid), "rlpipe.pid_start": ticks}
    if run_id:
        labels["rlpipe.run_id"] = run_id
    return labels


def owner_gone(labels: dict[str, str], hostname: str) -> bool:
    """Whether the process that made a container with these labels, on `hostname`, no longer runs."""
    if labels.get("rlpipe.host") != hostname:
        return False
    pid_text = labels.get("rlpipe.pid", "")
    if not pid_text.isdigit():
        return True
    return not process_alive(int(pid_text), labels.get("rlpipe.pid_start"))


def remove_leaked_containers(all_hosts: bool = False, base_url: str | None = None, client=None) -> int:
    """Remove sandbox containers whose creating process (on this host) no longer runs; how many.

    With `all_hosts`, containers created from other hosts (same engine) are removed too.
    """
    import docker.errors

    client = client if client is not None else docker_client(base_url)
    hostname = socket.gethostname()
    removed = 0
    # one list call (labels included): no inspect per container, and a container removed by
    # another process in between is a NotFound below, skipped
    for summary in client.api.containers(all=True, filters={"label": f"{LABEL}=1"}):
        labels = summary.get("Labels") or {}
        if not (owner_gone(labels, hostname) or (all_hosts and labels.get("rlpipe.host") != hostname)):
            continue
        try:
            client.api.remove_container(summary["Id"], force=True)
            removed += 1
        except docker.errors.NotFound:
            pass
    return removed


def reap_once(client, base_url: str | None) -> None:
    """The first time this process opens a sandbox on engine `base_url`: remove the orphaned
    containers and snapshot dirs. A failure is logged, not raised (opening the sandbox decides)."""
    import docker.errors

    with _reaped_lock:
        if base_url in _reaped:
            return
        _reaped.add(base_url)
    try:
        containers = remove_leaked_containers(base_url=base_url, client=client)
        snapshot_dirs = remove_leaked_snapshot_dirs()
    except (docker.errors.DockerException, OSError) as exc:
        log.warning("could not remove the docker sandboxes of dead processes: %s", exc)
        return
    if containers or snapshot_dirs:
        log.info("removed %d container(s) and %d snapshot dir(s) that dead processes left", containers, snapshot_dirs)


def reap_in_background(wait_s: float = 5.0) -> None:
    """Where a local docker engine may run (DOCKER_HOST set, or the default socket present),
    do `reap_once` for it on a daemon thread and wait for it at most `wait_s`, so a command
    that opens no docker sandbox itself (a bwrap `rlpipe train`, `qa`, `verify`, `eval`)
    still removes what a killed eval left; an engine that does not answer within `wait_s`
    does not hold the command up (the thread goes on while the command runs)."""
    if not (os.environ.get("DOCKER_HOST") or os.path.exists("/var/run/docker.sock")):
        return

    def reap() -> None:
        from rlpipe.core.errors import SandboxUnavailable

        try:
            reap_once(docker_client(None), None)
        except SandboxUnavailable:  # no engine answers: nothing of ours can be running there
            pass

    thread = threading.Thread(target=reap, name="rlpipe-reap-containers", daemon=True)
    thread.start()
    thread.join(wait_s)
