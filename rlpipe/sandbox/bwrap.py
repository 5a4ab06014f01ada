"""The bubblewrap backend: a sandbox is a work dir plus a fresh set of namespaces per exec.

Each `exec` starts `bwrap` with new user, pid, net, ipc, uts, mount and cgroup namespaces
(`--unshare-all`), `--die-with-parent`, `--new-session` and `--disable-userns`. Inside: the
host's /usr (and the /bin, /lib, /lib64 links into it) read-only with every site-packages and
dist-packages dir in it (and in a bound interpreter prefix) covered by an empty read-only
tmpfs (the standard library stays, installed packages do not), a minimal synthetic /etc,
fresh /proc and /dev, `/`, /etc and /dev remounted read-only, size-limited tmpfs /tmp and
/dev/shm (`disk_mb` each), and the sandbox's work dir at /work (and at a Workspace's path,
the cwd, when a task's files live elsewhere, e.g. /app: the same folder bound twice); uid and
gid 1000, an environment of PATH, HOME=/work, LANG and TMPDIR only; no network interface but
loopback unless `Limits.network`. Nothing else of the host is mounted (not /root, /home, /work,
the project, the venv).

When this process is root (the usual case in a container), each sandbox gets:
- its own unprivileged host uid (bwrap runs as it, so even an escape lands as nobody and
  RLIMIT_NPROC counts this sandbox alone),
- a host tmpfs of `disk_mb` as the work dir (files persist across execs; reset = remount),
- a memory cgroup (v1, or a delegated v2 subtree with pids too) for memory, OOM detection
  and killing the whole tree, where the host allows (see limits.py); bwrap's child joins it
  by pid while it waits on --block-fd, before the command runs; bwrap itself stays outside;
- rlimits always (util-linux `prlimit` execs bwrap): CPU time, file size, core, and
  RLIMIT_NPROC, which caps processes because the uid is this sandbox's alone.
Otherwise (not root): bwrap runs as the caller, the work dir is a plain directory whose
files are bounded only by RLIMIT_FSIZE per file (the disk_fill attack is *not* contained:
`rlpipe sandbox selftest` says so), memory is bounded by RLIMIT_AS, and processes by
RLIMIT_NPROC of the caller's uid (shared with everything else the caller runs).

The command is the pid namespace's pid 1 (`--as-pid-1`). When it exits, or when the
wall-clock timeout SIGKILLs it, the kernel kills every process left in the namespace (and
the cgroup is emptied as well); bwrap reaps it, so no zombie is left to a host init that
may not reap. If this process dies, `--die-with-parent` takes the sandbox down. Nothing the
sandboxed code starts survives its exec.

Snapshots copy the work dir with holes and hard links kept, refused (AgentStateError) past
`disk_mb` of data (bwrap_workdir.py, tree_copy.py). This module holds the sandbox class;
bwrap's arguments are bwrap_mounts.py's, starting and killing it bwrap_process.py's, and
the removal of what dead processes left bwrap_reap.py's.

Not guaranteed: protection from kernel exploits (no seccomp filter beyond bwrap's own), from
timing side channels, or from CPU oversubscription (CPU time is limited per process, not CPU
share); exit codes of signalled processes are reported as bwrap reports them (128 + signal).
"""

from __future__ import annotations

import logging
import os
import random
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from rlpipe.core.errors import SandboxUnavailable
from rlpipe.sandbox import limits as limits_module
from rlpipe.sandbox import bwrap_verifier
from rlpipe.sandbox.base import ExecResult, Limits, Snapshot, VerifierRun, Workspace, workspace_problem
from rlpipe.sandbox.bwrap_mounts import (
    default_python_prefix,
    default_runtime_root,
    mount_args,
    prepare_runtime_root,
    require_tools,
)
from rlpipe.sandbox.bwrap_process import kill_bwrap, start_bwrap
from rlpipe.sandbox.bwrap_reap import cgroup_name, reap_leaked_sandboxes, umount
from rlpipe.sandbox.bwrap_workdir import (
    empty_work_dir,
    load_snapshot,
    make_work_dir,
    mount_work_tmpfs,
    restore_work_root,
    save_snapshot,
)
from rlpipe.sandbox.output import pump
from rlpipe.sandbox.owner import this_process
from rlpipe.sandbox.warm_python import (
    SERVER_ARGV,
    WarmInterpreter,
    WarmServerDiedMidRequest,
    WarmServerLost,
    died_mid_request_result,
)
from rlpipe.sandbox.workdir import read_beneath, write_beneath

WARM_START_ATTEMPTS = 3  # consecutive failed starts of a warm interpreter before exec_python stops trying
SANDBOX_UID_BASE = 1_200_000
SANDBOX_UID_SPAN = 100_000
_probed: dict[tuple[str, bool, bool], str] = {}  # (runtime root, as_root, network) -> "" if ok, else why not
# bwrap's --die-with-parent fires when the *thread* that started it ends: warm servers, which
# outlive the call that starts them, are started from this one long-lived thread
_spawner = ThreadPoolExecutor(max_workers=1, thread_name_prefix="bwrap-warm-spawner")
log = logging.getLogger(__name__)
__all__ = ["BwrapSandbox", "bwrap_available", "default_runtime_root", "reap_leaked_sandboxes"]



class BwrapSandbox:
    """One bubblewrap sandbox: a work dir (`/work` inside) and the limits of every exec in it."""

    def __init__(self, limits: Limits = Limits(), *, runtime_root: Path | None = None, python_prefix: str | None = None,
                 workspace: Workspace = Workspace()) -> None:
        """`workspace`: the task's work dir path (the work dir is bound there too) and its variables."""
        problem = workspace_problem(workspace.path)
        if problem:
            raise ValueError(problem)
        self.limits = limits
        self.workspace = workspace
        self.runtime_root = runtime_root or default_runtime_root()
        self._as_root = os.geteuid() == 0
        require_tools()
        prepare_runtime_root(self.runtime_root)
        self.name, self.host_uid = self._allocate()
        self.dir = self.runtime_root / self.name
        self.work_dir = self.dir / "work"
        self._closed = False
        self._snapshots: list[Path] = []
        self.work_on_tmpfs = False
        self._warm: tuple[WarmInterpreter, int | None] | None = None  # the server and its host pid
        self._warm_failure = ""  # why a warm server last failed to start here
        self._warm_start_failures = 0  # after WARM_START_ATTEMPTS, exec_python always execs
        try:
            self.work_on_tmpfs = make_work_dir(self.work_dir, self.host_uid, limits.disk_mb, self._as_root)
            layout = limits_module.detect_cgroups() if self._as_root else None
            # RLIMIT_NPROC of this sandbox's own uid caps processes: no pids cgroup needed (saves a v1 move)
            tag = cgroup_name(self.runtime_root, self.name)
            self.cgroups = limits_module.create_cgroups(layout, tag, limits, pids_cgroup=False) if layout else None
            self._python_prefix = python_prefix if python_prefix is not None else default_python_prefix(self._as_root)
            self._bwrap_args = mount_args(limits, self.runtime_root, self.work_dir, self._python_prefix, workspace)
            self._prlimit_argv = limits_module.prlimit_argv(limits, memory_by_cgroup=self.cgroups is not None)
            self._probe()
        except BaseException:
            self.close()
            raise

    # -- the protocol -------------------------------------------------------------------

    def exec(self, argv: list[str], stdin: bytes = b"", timeout_s: float | None = None) -> ExecResult:
        return self.exec_with_mounts(argv, self.limits.timeout_s if timeout_s is None else timeout_s, (), stdin)

    def run_verifier(self, argv: list[str], tests: dict[str, bytes], timeout_s: float) -> VerifierRun:
        """A task's tests on this sandbox's state (base.VerifierSandbox; bwrap_verifier.py)."""
        return bwrap_verifier.run_verifier(self.exec_with_mounts, self.dir, self.host_uid, self.runtime_root, argv, tests,
                                           timeout_s, self.limits.disk_mb if self.work_on_tmpfs else None)

    def exec_with_mounts(self, argv: list[str], timeout_s: float, extra_args: Sequence[str], stdin: bytes = b"") -> ExecResult:
        """`exec` with more bwrap arguments (binds, --setenv) before the root is made read-only."""
        self._stop_warm()  # the cgroup sweep after this exec would kill it anyway
        oom_before = self.cgroups.oom_kill_count() if self.cgroups else 0
        started = time.monotonic()
        process, child_pid = self._start(argv, extra_args)
        try:
            captured = pump(process.stdin, process.stdout.fileno(), process.stderr.fileno(),
                            stdin, self.limits.output_bytes, started + timeout_s)
        finally:
            process.stdout.close()
            process.stderr.close()
        if captured.deadline_passed:
            self._kill(process, child_pid)
        returncode = process.wait()
        duration_s = time.monotonic() - started
        if self.cgroups:
            self.cgroups.kill_all()  # nothing should be left; make sure
        oom_killed = (self.cgroups.oom_kill_count() > oom_before) if self.cgroups else _looks_like_rlimit_oom(
            returncode, captured.stderr.text())
        killed = captured.deadline_passed or returncode < 0 or (oom_killed and returncode == 128 + signal.SIGKILL)
        return ExecResult(
            exit_code=None if killed else returncode,
            stdout=captured.stdout.text(), stderr=captured.stderr.text(),
            stdout_truncated=captured.stdout.truncated, stderr_truncated=captured.stderr.truncated,
            duration_s=duration_s, timed_out=captured.deadline_passed, oom_killed=oom_killed,
        )

    def exec_python(self, code: str, stdin: bytes = b"", timeout_s: float | None = None,
                    args: Sequence[str] = ()) -> ExecResult:
        """`exec(["python3", "-I", "-S", "-c", code, *args])`, forked from this sandbox's warm interpreter.

        The first call starts the warm server (warm_server.py) in this sandbox; later calls
        cost a fork. The same limits, output caps and verdict fields apply; a request that
        outruns its timeout is killed with everything it started. If the server cannot start
        here, or is gone before it takes the request, the request runs by `exec` instead. A
        server that dies while it runs a request (only the request's code can do that) makes
        that request a crash (exit_code None), not a rerun with a fresh time budget.
        """
        timeout_s = self.limits.timeout_s if timeout_s is None else timeout_s
        warm = self._warm_interpreter()
        if warm is None:
            return self.exec(["python3", "-I", "-S", "-c", code, *args], stdin, timeout_s)
        oom_before = self.cgroups.oom_kill_count() if self.cgroups else 0
        started = time.monotonic()
        try:
            answer = warm.run(code, list(args), stdin, timeout_s, self.limits.output_bytes)
        except WarmServerDiedMidRequest as exc:
            self._stop_warm()
            oom_killed = bool(self.cgroups) and self.cgroups.oom_kill_count() > oom_before
            return died_mid_request_result(exc, time.monotonic() - started, oom_killed)
        except WarmServerLost as exc:
            log.info("sandbox %s: warm interpreter gone (%s); running this request by exec", self.name, exc)
            self._stop_warm()
            return self.exec(["python3", "-I", "-S", "-c", code, *args], stdin, timeout_s)
        if answer.residue:
            log.info("sandbox %s: retiring the warm interpreter: %s", self.name, "; ".join(answer.residue))
        if warm.due_for_retirement(answer, self.limits.cpu_time_s):
            self._stop_warm()
        oom_killed = (self.cgroups.oom_kill_count() > oom_before) if self.cgroups else _looks_like_rlimit_oom(
            answer.exit_code, answer.stderr.decode("utf-8", errors="replace"))
        killed = answer.timed_out or (oom_killed and answer.signal == signal.SIGKILL)
        return answer.exec_result(time.monotonic() - started, oom_killed, killed)

    def _warm_interpreter(self) -> WarmInterpreter | None:
        """This sandbox's running warm server, started if need be; None where none can run."""
        if self._warm is not None:
            if self._warm[0].alive:
                return self._warm[0]
            self._stop_warm()
        if self._warm_start_failures >= WARM_START_ATTEMPTS:
            return None
        process, child_pid = _spawner.submit(self._start, SERVER_ARGV).result()
        try:
            self._warm = (WarmInterpreter(process), child_pid)
        except WarmServerLost as exc:
            self._kill(process, child_pid)
            stderr = process.stderr.read(2000).decode(errors="replace").strip() if process.poll() is not None else ""
            self._warm_failure = f"{exc}: {stderr}" if stderr else str(exc)
            self._warm_start_failures += 1
            log.warning("sandbox %s: the warm interpreter did not start (%s); this request runs by exec",
                        self.name, self._warm_failure)
            for stream in (process.stdin, process.stdout, process.stderr):
                stream.close()
            return None
        self._warm_start_failures = 0
        return self._warm[0]

    def _stop_warm(self) -> None:
        if self._warm is None:
            return
        warm, child_pid = self._warm
        self._warm = None
        self._kill(warm.process, child_pid)
        warm.close_pipes()

    def _start(self, argv: list[str], extra_args: Sequence[str] = ()) -> tuple[subprocess.Popen[bytes], int | None]:
        """bwrap with this sandbox's arguments, `extra_args` (binds, --setenv) inserted before the root is made read-only."""
        bwrap_args = [*self._bwrap_args[:-2], *extra_args, *self._bwrap_args[-2:]]
        return start_bwrap([*self._prlimit_argv, "bwrap", *bwrap_args], argv, self.cgroups, self._drop_privileges())

    def write_files(self, files: dict[str, bytes]) -> None:
        for path, content in files.items():
            write_beneath(self.work_dir, path, content, uid=self.host_uid)

    def read_file(self, path: str) -> bytes:
        return read_beneath(self.work_dir, path, max_bytes=self.limits.disk_mb * 1024 * 1024)

    def snapshot(self) -> Snapshot:
        """Copy the work dir under the runtime root (sparse files stay sparse, hard links links);
        AgentStateError when it holds more data than `Limits.disk_mb`."""
        snapshot_id = f"{self.name}-{uuid.uuid4().hex[:12]}"
        target = self.runtime_root / "snapshots" / snapshot_id
        self._snapshots.append(target)
        save_snapshot(self.work_dir, target, self.limits.disk_mb)
        return Snapshot(snapshot_id=snapshot_id)

    def restore(self, snapshot: Snapshot) -> None:
        source = self.runtime_root / "snapshots" / snapshot.snapshot_id
        if "/" in snapshot.snapshot_id or not source.is_dir():
            raise ValueError(f"no snapshot {snapshot.snapshot_id!r} under {self.runtime_root}")
        self.reset()
        load_snapshot(source, self.work_dir, self.host_uid, self.limits.disk_mb)

    def reset(self) -> None:
        if self._warm is not None and self._warm[0].alive:
            # the warm server killed what each request started and emptied /tmp; it sees this
            # tmpfs through its own mount namespace, so empty it rather than mount a new one,
            # and give its root back the mode, owner and (no) xattrs of a fresh one
            try:
                empty_work_dir(self.work_dir)
                restore_work_root(self.work_dir, self.host_uid, self._as_root)
                return
            except (OSError, RecursionError):  # e.g. dirs nested too deep for rmtree: a fresh mount
                pass
        self._stop_warm()
        if self.cgroups:
            self.cgroups.kill_all()
        if self.work_on_tmpfs:
            umount(self.work_dir)
            mount_work_tmpfs(self.work_dir, self.host_uid, self.limits.disk_mb)
        else:
            empty_work_dir(self.work_dir)
            restore_work_root(self.work_dir, self.host_uid, self._as_root)

    def close(self) -> None:
        if getattr(self, "_closed", True):
            return
        self._closed = True
        self._stop_warm()
        if getattr(self, "cgroups", None):
            self.cgroups.remove_soon()
        if self.work_on_tmpfs:
            umount(self.work_dir)
        shutil.rmtree(self.dir, ignore_errors=True)
        for snapshot_dir in self._snapshots:
            shutil.rmtree(snapshot_dir, ignore_errors=True)

    def enforcement(self) -> str:
        """How this host enforces the limits, in one line (printed by `rlpipe sandbox selftest`)."""
        memory = (f"memory cgroup v{self.cgroups.layout.version}" if self.cgroups
                  else "RLIMIT_AS (no writable memory cgroup)")
        work = f"tmpfs work dir of {self.limits.disk_mb} MB" if self.work_on_tmpfs else "plain work dir (RLIMIT_FSIZE per file only)"
        uid = f"own host uid {self.host_uid}" if self._as_root else f"the caller's uid {self.host_uid}"
        return f"{uid}; {work}; {memory}; RLIMIT_NPROC/CPU/FSIZE"

    def __enter__(self) -> BwrapSandbox:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- setup ----------------------------------------------------------------------------

    def _allocate(self) -> tuple[str, int]:
        """A fresh sandbox dir (and, as root, a host uid no other live sandbox uses)."""
        owner = "{} {}\n".format(*this_process())
        for _ in range(1000):
            if self._as_root:
                uid = SANDBOX_UID_BASE + random.randrange(SANDBOX_UID_SPAN)
                name = f"u{uid}"
            else:
                uid, name = os.getuid(), f"p{os.getpid()}-{uuid.uuid4().hex[:8]}"
            try:
                (self.runtime_root / name).mkdir(mode=0o711)
            except FileExistsError:
                continue
            (self.runtime_root / name / "owner").write_text(owner)
            return name, uid
        raise SandboxUnavailable(f"no free sandbox slot under {self.runtime_root}", hint="run `rlpipe sandbox selftest` to reap leaked sandboxes")

    def _kill(self, process: subprocess.Popen[bytes], child_pid: int | None) -> None:
        kill_bwrap(process, child_pid, self.cgroups)

    def _drop_privileges(self) -> dict[str, object]:
        if self._as_root:
            return {"user": self.host_uid, "group": self.host_uid, "extra_groups": []}
        return {}

    def _probe(self) -> None:
        """Fail fast, with a hint, when bwrap cannot build namespaces on this host."""
        key = (str(self.runtime_root), self._as_root, self.limits.network)
        if key not in _probed:
            result = self.exec(["/bin/true"], timeout_s=10.0)
            _probed[key] = "" if result.exit_code == 0 else (result.stderr.strip() or f"exit code {result.exit_code}")
        if _probed[key]:
            raise SandboxUnavailable(
                f"bubblewrap cannot create a sandbox here: {_probed[key]}",
                hint="enable user namespaces (sysctl kernel.unprivileged_userns_clone=1, user.max_user_namespaces>0) "
                     "or, inside a container, run it with --privileged or a seccomp profile that allows clone(CLONE_NEWUSER)",
            )

def bwrap_available() -> str:
    """"" when a BwrapSandbox can be made on this host, else the reason why not."""
    try:
        BwrapSandbox(Limits()).close()
    except SandboxUnavailable as exc:
        return str(exc)
    return ""


def _looks_like_rlimit_oom(returncode: int, stderr: str) -> bool:
    """Without a memory cgroup, RLIMIT_AS makes allocations fail: a Python MemoryError or a SIGKILL/SIGSEGV."""
    tail = stderr.rstrip().rsplit("\n", 1)[-1]
    return tail.startswith("MemoryError") or returncode in (128 + signal.SIGSEGV,)
