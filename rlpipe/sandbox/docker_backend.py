"""The docker sandbox backend: one long-lived container per sandbox, commands run by `exec`.

Guaranteed (each has an adversarial test in tests/sandbox/test_docker_attacks.py):
- no network: `network_mode=none` (only `lo` inside; the host's loopback is unreachable);
  `Limits.network=True` puts the container on the default bridge instead;
- the root filesystem is the read-only image built by sandbox/image.py from host files, or
  a task's own image (docker_task_image.py) (no host path is mounted in, so host files, the
  project and /root are not visible);
- writable places are size-limited tmpfs mounts: /work (`Limits.disk_mb`), /tmp and
  /dev/shm (the same size; /tests and /logs are root's); tmpfs pages count as memory too;
- memory: `mem_limit` = `memswap_limit` = `Limits.memory_mb` (no swap); the kernel's OOM
  killer ends the biggest process and `ExecResult.oom_killed` says so (read from the
  cgroup's `oom_kill` counter, else from `docker inspect`);
- processes: `pids_limit` = `Limits.max_processes` + 4 (the reaper init, the exec wrapper,
  a killer); CPU: `nano_cpus` (the `cpus` argument) and RLIMIT_CPU = `Limits.cpu_time_s`;
- user 1000 (non-root), all capabilities dropped, `no-new-privileges`; the environment
  holds only PATH and HOME (nothing of the host's); the container's init (pid 1, a reaper)
  runs as nobody (65534) and is not dumpable, so commands can neither signal nor ptrace it;
- `reset()` empties /work, /tmp and /dev/shm and gives /work's root back its mode and no
  extended attributes (a command could chmod it or set a default ACL for the next user);
- every command ends with all of the sandbox user's processes killed (`kill -9 -1` in the
  exec wrapper), so nothing a command started outlives it; on the wall-clock timeout the
  same kill runs from a second exec, and if processes remain after that (a fork bomb that
  fills the pid limit) the container itself is killed and replaced: the work dir is then
  lost (empty), which the ExecResult cannot show (it says timed_out);
- stdout and stderr are read as they come and kept up to `Limits.output_bytes` each; the
  rest is read and dropped (never buffered), the `*_truncated` flags say so;
- `close()` removes the container and the sandbox's snapshots; every container is labelled
  with its owning process (pid and start time) and run id, and the first sandbox a process
  opens removes the containers of owners that are gone (docker_owners.py: a `kill -9`ed
  eval's containers are removed by the next command that opens one).

`exec_python` forks each request from a warm interpreter: sandbox/warm_server.py, started
with `--not-init` on first use by one attached `docker exec` that stays open (docker_warm.py
turns its stream into the pipes warm_python.WarmInterpreter reads). A request gets what an
exec gets (container, user, limits, environment, cwd, exit codes, output caps, timeout,
oom_killed from the same counter) and, after it, the server kills every other process of
the user (orphans included) and empties /tmp and /dev/shm. A request can kill or stop the
server (same uid, not the init): one that dies or garbles mid-request makes that request a
crash, one silent past the timeout plus a grace period a timeout; either way every process
of the user is killed and the request is never rerun (no second time budget). A request
runs by exec where the server cannot start or is found gone. A plain `exec` retires the
server first (its wrapper's kill would end it); `reset()` keeps it, and while it runs it
serves the wipe and `write_files` too. What differs from exec: stderr lacks the wrapper
shell's line about a signalled command ("Killed"), and the server's modules are imported.

Files, snapshots and the wipe are docker_files.py's DockerWorkDir, which a DockerSandbox
holds (snapshots are files on the host's disk, never this process's memory); a task's
tests, docker_verifier.py's (/tests and /logs are root's tmpfs mounts); what runs in the
container, modules of sandbox/programs/.

Not guaranteed: isolation from kernel exploits (containers share the host kernel; use
gVisor/kata as the runtime for hostile code at scale); one command at a time per sandbox
(the end-of-command kill would hit a concurrent command); exit codes of signalled commands
follow the shell (128 + signal). Docker's own daemon is trusted and must be running: when no
engine answers, SandboxUnavailable says how to start one.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from typing import BinaryIO

from rlpipe.core.errors import SandboxUnavailable
from rlpipe.sandbox import docker_verifier
from rlpipe.sandbox.base import WORK, ExecResult, Limits, Snapshot, VerifierRun, Workspace, workspace_problem
from rlpipe.sandbox.docker_engine import START_HINT, docker_client
from rlpipe.sandbox.docker_files import WORK_PROGRAM as _WORK, ContainerCalls, DockerWorkDir
from rlpipe.sandbox.docker_owners import LABEL, owner_labels, reap_once, remove_leaked_containers
from rlpipe.sandbox.docker_snapshots import SnapshotStore, work_inodes
from rlpipe.sandbox.docker_stream import AGENT, Capture, Identity, RawRun, read_until, send_stdin
from rlpipe.sandbox.docker_task_image import workspace_image
from rlpipe.sandbox.tests_runtime import RUNTIME_PATH
from rlpipe.sandbox.docker_warm import ExecStreamProcess
from rlpipe.sandbox.image import SANDBOX_UID, ensure_image
from rlpipe.sandbox.programs import program_source
from rlpipe.sandbox.warm_python import (NOT_INIT_SERVER_ARGV, WarmAnswer, WarmInterpreter, WarmServerDiedMidRequest,
                                        WarmServerLost, died_mid_request_result)

log = logging.getLogger(__name__)

__all__ = ["LABEL", "DockerSandbox", "docker_client", "remove_leaked_containers"]
_INIT_USER = "65534:65534"
_KILL_ALL = 'i=0; while kill -9 -1 2>/dev/null && [ $i -lt 2000 ]; do i=$((i+1)); done'
# ends when `kill -9 -1` finds none of the user's processes (`kill -0 -1`'s test); at 2000 rounds, 0.1 s, then that test
_KILL_ALL_OR_FAIL = 'i=0; while kill -9 -1 2>/dev/null; do i=$((i+1)); [ $i -lt 2000 ] || { sleep 0.1; kill -0 -1 2>/dev/null && exit 1; break; }; done'
_WRAPPER = ["/bin/sh", "-c", f'"$@"; rc=$?; {_KILL_ALL}; exit $rc', "rlpipe-exec"]
# the warm server gets the environment a wrapped command gets (dash adds PWD), and no kill at its end
_WARM_SERVER = ["/bin/sh", "-c", 'exec "$@"', "rlpipe-warm", *NOT_INIT_SERVER_ARGV]
_INIT = program_source("programs/docker_init.py")  # the container's pid 1 (sandbox/programs/)


class DockerSandbox:
    """A sandbox in one docker container; see the module docstring for what it guarantees."""

    def __init__(self, limits: Limits, image: str | None = None, cpus: float = 1.0,
                 base_url: str | None = None, run_id: str | None = None, workspace: Workspace = Workspace()) -> None:
        """A started container; `image` defaults to the one ensure_image builds from host files,
        `cpus` is its CPU share (nano_cpus), `base_url` the engine (None: DOCKER_HOST or the local socket),
        `run_id` (an eval's or run's id) goes into the container's owner labels (docker_owners.py).
        The first sandbox of a process on an engine first removes the containers of dead processes.
        `workspace`: the task's image (instead of `image`), work dir path (the /work tmpfs is
        mounted there, the image's /work links to it: docker_task_image.py) and variables."""
        problem = workspace_problem(workspace.path)
        if problem:
            raise ValueError(problem)
        self.limits = limits
        self.workspace = workspace
        self.cpus = cpus
        self.run_id = run_id
        self._client = docker_client(base_url)
        reap_once(self._client, base_url)
        self.image = workspace.image or image or ensure_image(self._client)
        if workspace.path != WORK:
            self.image = workspace_image(self._client, self.image, workspace.path)
        self.work_dir = DockerWorkDir(ContainerCalls(self._run, self._ours, self._replace_container), limits, SnapshotStore())
        self._container_id: str | None = None
        self._oom_baseline = 0
        self._warm: WarmInterpreter | None = None  # the container's warm server, once exec_python started it
        self._warm_failure = ""  # why a warm server could not start here (then exec_python execs)
        self._start_container()

    # --- lifecycle -------------------------------------------------------------------
    def _start_container(self) -> None:
        import docker.errors
        from docker.types import LogConfig, Ulimit

        limits = self.limits
        tmpfs_options = f"size={limits.disk_mb}m,nosuid,nodev"
        try:
            container = self._client.containers.run(
                # the init runs as nobody: commands (uid 1000) can neither signal nor ptrace it
                self.image, entrypoint=["python3", "-I", "-S", "-c", _INIT], detach=True, user=_INIT_USER,
                mem_limit=f"{limits.memory_mb}m", memswap_limit=f"{limits.memory_mb}m",
                nano_cpus=int(self.cpus * 1e9), pids_limit=limits.max_processes + 4,
                network_mode="bridge" if limits.network else "none", read_only=True,
                tmpfs={self.workspace.path: f"{tmpfs_options},nr_inodes={work_inodes(limits.disk_mb)},exec,uid={SANDBOX_UID},"
                                f"gid={SANDBOX_UID},mode=0700",
                       "/tmp": f"{tmpfs_options},mode=1777",  # /tests, /logs: root's, for run_verifier
                       "/tests": f"{tmpfs_options},mode=0755", "/logs": f"{tmpfs_options},mode=0755",
                       RUNTIME_PATH: "size=64m,exec,nosuid,nodev,mode=0755"},
                shm_size=f"{limits.disk_mb}m", working_dir=WORK, environment=dict(self.workspace.env), hostname="sandbox",
                cap_drop=["ALL"], security_opt=["no-new-privileges"], log_config=LogConfig(type="none"),
                ulimits=[Ulimit(name="cpu", soft=limits.cpu_time_s, hard=limits.cpu_time_s)],
                labels=owner_labels(self.run_id),
            )
        except docker.errors.DockerException as exc:
            raise SandboxUnavailable(f"docker could not start a sandbox container: {exc}",
                                     hint="check `docker info` and the engine log") from exc
        self._container_id = container.id
        self.work_dir.needs_wipe = False
        self._oom_baseline = self._oom_count()

    def _replace_container(self) -> None:
        """Kill and remove the container and start a fresh one (the work dir is lost)."""
        self._remove_container()
        self._start_container()

    def _remove_container(self) -> None:
        import docker.errors

        if self._container_id is None:
            return
        self._stop_warm()
        try:
            self._client.api.remove_container(self._container_id, force=True)
        except docker.errors.NotFound:
            pass
        except docker.errors.DockerException as exc:
            raise SandboxUnavailable(f"docker could not remove container {self._container_id[:12]}: {exc}",
                                     hint=START_HINT) from exc
        self._container_id = None

    def close(self) -> None:
        self._remove_container()
        self.work_dir.snapshots.clear()

    def run_verifier(self, argv: list[str], tests: dict[str, bytes], timeout_s: float) -> VerifierRun:
        """A task's tests on this sandbox's state (base.VerifierSandbox; docker_verifier.py)."""
        self._stop_warm()
        self._kill_everything()  # nothing of the user's may see the tests arrive, the warm server included
        self.work_dir.wipe_if_needed()
        return docker_verifier.run_verifier(self._run, self._kill_everything, argv, tests, timeout_s, self.limits.output_bytes)

    def __enter__(self) -> DockerSandbox:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # --- files and state: the work dir's (docker_files.py) -----------------------------
    def write_files(self, files: dict[str, bytes]) -> None:
        self.work_dir.write_files(files)

    def read_file(self, path: str) -> bytes:
        return self.work_dir.read_file(path)

    def snapshot(self) -> Snapshot:
        return self.work_dir.snapshot()

    def restore(self, snapshot: Snapshot) -> None:
        self.work_dir.restore(snapshot)

    def reset(self) -> None:
        self.work_dir.reset()

    # --- running commands ------------------------------------------------------------
    def exec_python(self, code: str, stdin: bytes = b"", timeout_s: float | None = None,
                    args: Sequence[str] = ()) -> ExecResult:
        """`exec(["python3", "-I", "-S", "-c", code, *args])`, forked from this container's warm interpreter.

        The first call starts warm_server.py in the container (one docker exec that stays
        attached); later calls cost a fork in the container and a round trip on that exec's
        stream. The server is not the container's init, so a request can kill or stop it.
        When it cannot start, or is gone before it takes the request, the request runs by
        `exec`. When it dies while it runs the request, every process of the sandbox user is
        killed and the request is a crash (exit_code None); when it answers nothing within
        the timeout (plus a grace period), a timeout. Never a rerun: a request cannot buy a
        second time budget, or repeat its side effects, by killing the server.
        """
        timeout_s = self.limits.timeout_s if timeout_s is None else timeout_s
        argv = ["python3", "-I", "-S", "-c", code, *args]
        self.work_dir.wipe_if_needed()
        warm = self._warm_interpreter()
        if warm is None:
            return self.exec(argv, stdin, timeout_s)
        started = time.monotonic()
        try:
            answer = warm.run(code, list(args), stdin, timeout_s, self.limits.output_bytes)
        except WarmServerDiedMidRequest as exc:  # WarmServerHung too: the request may have killed or stopped it
            self._stop_warm(kill_everything=True)
            return died_mid_request_result(exc, time.monotonic() - started, oom_killed=False)
        except WarmServerLost as exc:
            log.info("docker sandbox %s: warm interpreter gone (%s); running this request by exec",
                     self._container_id[:12], exc)
            self._stop_warm(kill_everything=True)
            return self.exec(argv, stdin, timeout_s)
        self._retire_warm_if_due(answer)
        oom_killed = not answer.timed_out and (
            answer.exit_code == 137 or b"MemoryError" in answer.stderr[-4096:]) and self._oom_happened()
        return answer.exec_result(time.monotonic() - started, oom_killed, killed=answer.timed_out)

    def _warm_interpreter(self) -> WarmInterpreter | None:
        """This container's running warm server, started if need be; None where none can run."""
        if self._warm is not None:
            if self._warm.alive:
                return self._warm
            self._stop_warm()
        if self._warm_failure:
            return None
        process = ExecStreamProcess(self._open_exec(_WARM_SERVER)[1])
        try:
            self._warm = WarmInterpreter(process)
        except WarmServerLost as exc:
            process.stop()
            stderr = process.stderr_head.decode(errors="replace").strip()
            self._warm_failure = f"{exc}: {stderr}" if stderr else str(exc)
            log.warning("docker sandbox %s: no warm interpreter (%s); exec_python runs each request by exec",
                        self._container_id[:12], self._warm_failure)
        return self._warm

    def _retire_warm_if_due(self, answer: WarmAnswer) -> None:
        """After an answer: retire the server if it is due (WarmInterpreter.due_for_retirement);
        one that left something behind goes with every process of the user."""
        if self._warm.due_for_retirement(answer, self.limits.cpu_time_s):
            self._stop_warm(kill_everything=not answer.clean)

    def _ours(self, program: str, args: list[str], stdin: bytes, timeout_s: float) -> RawRun:
        """A program of sandbox/programs/ (at most 4096 bytes of output kept): forked by the
        running warm server if there is one, else by its own `docker exec`; same user and cwd."""
        warm = self._warm if self._warm is not None and self._warm.alive else None
        if warm is not None:
            started = time.monotonic()
            try:
                answer = warm.run(program, args, stdin, timeout_s, 4096)
            except WarmServerLost as exc:
                log.warning("docker sandbox %s: warm interpreter lost (%s); running ours by exec",
                            self._container_id[:12], exc)
                self._stop_warm(kill_everything=True)
            else:
                self._retire_warm_if_due(answer)
                return RawRun(None if answer.timed_out else answer.exit_code, answer.stdout, answer.stderr,
                               answer.stdout_dropped > 0, answer.stderr_dropped > 0, answer.timed_out,
                               time.monotonic() - started)
        return self._run(["python3", "-I", "-S", "-c", program, *args], stdin, timeout_s, 4096)

    def _stop_warm(self, kill_everything: bool = False) -> None:
        """End the warm server's stream (an idle server exits at end of input); with
        `kill_everything`, also kill every process of the sandbox user, as after a timeout."""
        if self._warm is None:
            return
        warm, self._warm = self._warm, None
        warm.process.stop()
        if kill_everything:
            self._kill_everything()

    def exec(self, argv: list[str], stdin: bytes = b"", timeout_s: float | None = None) -> ExecResult:
        self._stop_warm()  # the wrapper's kill at the end of this command would kill it anyway
        timeout_s = self.limits.timeout_s if timeout_s is None else timeout_s
        self.work_dir.wipe_if_needed()
        raw = self._run(_WRAPPER + list(argv), stdin, timeout_s, self.limits.output_bytes)
        oom_killed = False
        if raw.timed_out:
            self._kill_everything()
        elif raw.exit_code in (137, -9, None) or b"MemoryError" in raw.stderr[-4096:]:
            oom_killed = self._oom_happened()
        return ExecResult(
            exit_code=None if raw.timed_out else raw.exit_code,
            stdout=raw.stdout.decode("utf-8", errors="replace"),
            stderr=raw.stderr.decode("utf-8", errors="replace"),
            stdout_truncated=raw.stdout_truncated, stderr_truncated=raw.stderr_truncated,
            duration_s=raw.duration_s, timed_out=raw.timed_out, oom_killed=oom_killed,
        )

    def _run(self, argv: list[str], stdin: bytes | BinaryIO, timeout_s: float, cap_bytes: int | None,
             capture: Capture | None = None, identity: Identity = AGENT) -> RawRun:
        """Run argv by `docker exec` as `identity`, feeding stdin (bytes or a file) and reading both streams
        until EOF, the deadline, or (with a `capture` that writes stdout to a file) its cap; then no exit code."""
        started = time.monotonic()
        exec_id, connection = self._open_exec(argv, identity)
        raw_socket = getattr(connection, "_sock", connection)
        writer = threading.Thread(target=send_stdin, args=(raw_socket, stdin), daemon=True)
        writer.start()
        capture = capture or Capture(cap_bytes)
        deadline = started + timeout_s
        timed_out = read_until(raw_socket, capture, deadline)
        connection.close()
        exit_code = None if timed_out or capture.overflowed else self._exit_code(exec_id)
        return RawRun(exit_code, bytes(capture.chunks[1]), bytes(capture.chunks[2]), capture.truncated[1],
                       capture.truncated[2], timed_out, time.monotonic() - started)

    def _open_exec(self, argv: list[str], identity: Identity = AGENT):
        """Start argv by an attached `docker exec`: (exec id, connection); a stopped container is replaced once."""
        import docker.errors

        if self._container_id is None:
            raise SandboxUnavailable("this docker sandbox is closed", hint="create a new DockerSandbox")
        try:
            return self._start_exec(argv, identity)
        except docker.errors.APIError as exc:
            if exc.status_code != 409:  # 409: the container stopped (its init was OOM-killed): replace it once
                raise SandboxUnavailable(f"docker exec failed in container {self._container_id[:12]}: {exc}",
                                         hint=START_HINT) from exc
            self._replace_container()
            return self._start_exec(argv, identity)
        except docker.errors.DockerException as exc:
            raise SandboxUnavailable(f"docker exec failed in container {self._container_id[:12]}: {exc}",
                                     hint=START_HINT) from exc

    def _start_exec(self, argv: list[str], identity: Identity):
        exec_id = self._client.api.exec_create(self._container_id, argv, stdin=True, user=identity.user,
                                               workdir="/work", environment=dict(identity.environment))["Id"]
        return exec_id, self._client.api.exec_start(exec_id, socket=True)

    def _exit_code(self, exec_id: str) -> int | None:
        import docker.errors

        for _ in range(50):
            try:
                state = self._client.api.exec_inspect(exec_id)
            except docker.errors.DockerException as exc:
                raise SandboxUnavailable(f"docker exec inspect failed: {exc}", hint=START_HINT) from exc
            if not state.get("Running") and state.get("ExitCode") is not None:
                return int(state["ExitCode"])
            time.sleep(0.01)
        return None

    def _kill_everything(self, then: str = "true") -> None:
        """Kill every sandbox process from inside, then run the shell command `then` as the
        sandbox user in the same exec (nothing of the user's left to race it); if the kill
        fails, replace the container."""
        try:
            if self._run(["/bin/sh", "-c", f"{_KILL_ALL_OR_FAIL}; {then}; exit 0"], b"", 5.0, 4096).exit_code == 0:
                return
        except SandboxUnavailable:
            pass
        self._replace_container()

    def _oom_count(self) -> int:
        raw = self._ours(_WORK, ["oom-count"], b"", 10.0)
        try:
            return int(raw.stdout.strip() or -1)
        except ValueError:
            return -1

    def _oom_happened(self) -> bool:
        import docker.errors

        count = self._oom_count()
        if count >= 0:
            happened = count > self._oom_baseline
            self._oom_baseline = count
            return happened
        try:
            return bool(self._client.api.inspect_container(self._container_id)["State"].get("OOMKilled"))
        except docker.errors.DockerException:
            return False
