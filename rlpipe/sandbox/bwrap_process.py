"""Starting and killing one bwrap process: prlimit -> bwrap, its child moved into the cgroups before it runs.

`start_bwrap` starts `prlimit ... bwrap ...` with `--info-fd` (bwrap writes its child's
host pid there) and `--block-fd` (the child waits on it), moves the child into the
sandbox's cgroups, then lets it run. `kill_bwrap` kills the namespace's pid 1 so that bwrap
reaps it, then sweeps the cgroups.

What it does not do: build bwrap's arguments (bwrap_mounts.py), read the command's output
or decide a verdict (bwrap.py).
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import time

from rlpipe.core.errors import SandboxUnavailable
from rlpipe.sandbox.limits import SandboxCgroups


def start_bwrap(prefix: list[str], argv: list[str], cgroups: SandboxCgroups | None,
                privileges: dict[str, object]) -> tuple[subprocess.Popen[bytes], int | None]:
    """Start prlimit -> bwrap; move bwrap's child into the cgroups while it waits on --block-fd.

    The child (the namespace's pid 1, which becomes the command) has not run a single
    instruction of the command when it joins, and bwrap itself stays outside the cgroups
    (an OOM kill never hits it). Returns bwrap and the child's host pid (None when
    bwrap failed before making the child: its error is then in the ExecResult).
    """
    info_read_fd, info_write_fd = os.pipe()
    block_read_fd, block_write_fd = os.pipe()
    fds = ["--info-fd", str(info_write_fd), "--block-fd", str(block_read_fd)]
    try:
        process = subprocess.Popen(
            [*prefix, *fds, "--", *argv], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={"PATH": "/usr/bin:/bin"}, close_fds=True,
            pass_fds=(info_write_fd, block_read_fd), process_group=0, **privileges,
        )
    except OSError as exc:  # the host cannot fork or exec right now: not the code's doing
        os.close(block_write_fd)
        os.close(info_read_fd)
        raise SandboxUnavailable(f"cannot start bwrap: {exc}", hint="the host is out of processes or memory") from exc
    except BaseException:  # e.g. ValueError for a NUL in argv: nothing started, no descriptor kept
        os.close(block_write_fd)
        os.close(info_read_fd)
        raise
    finally:
        os.close(info_write_fd)
        os.close(block_read_fd)
    child_pid = read_child_pid(info_read_fd)
    os.close(info_read_fd)
    failure = None
    if child_pid is not None and cgroups:
        try:
            cgroups.add(child_pid)
        except OSError as exc:
            os.kill(child_pid, signal.SIGKILL)
            failure = exc
    try:
        os.write(block_write_fd, b"go")
    except BrokenPipeError:
        pass  # bwrap is gone already; its exit status and stderr say why
    os.close(block_write_fd)
    if failure is not None:
        process.communicate(timeout=5.0)
        raise SandboxUnavailable(f"cannot move the sandboxed process into {cgroups.memory_dir}: {failure}",
                                 hint="the sandbox's cgroup vanished; close it and make a new one") from failure
    return process, child_pid


def kill_bwrap(process: subprocess.Popen[bytes], child_pid: int | None, cgroups: SandboxCgroups | None) -> None:
    """Kill the namespace's pid 1 (the command; the kernel then kills the rest of the namespace).

    Killing pid 1 rather than bwrap lets bwrap reap it, so no zombie is left to a host init
    that may not reap. Without a child pid, kill bwrap (`--die-with-parent` takes pid 1 down).
    """
    try:
        if child_pid is not None:
            os.kill(child_pid, signal.SIGKILL)
        else:
            os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    try:
        process.wait(timeout=2.0)  # bwrap reaps pid 1, then exits
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
    if cgroups:
        cgroups.kill_all()


def read_child_pid(info_fd: int, timeout_s: float = 10.0) -> int | None:
    """The host pid of bwrap's child, from the JSON bwrap writes to --info-fd (None if it wrote none)."""
    text = b""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        ready, _, _ = select.select([info_fd], [], [], deadline - time.monotonic())
        chunk = os.read(info_fd, 4096) if ready else b""
        if not chunk:
            break  # EOF: bwrap closed it (or exited)
        text += chunk
        try:
            child_pid = json.loads(text).get("child-pid")
            return child_pid if isinstance(child_pid, int) else None
        except ValueError:
            continue  # not complete yet
    return None
