"""The bubblewrap backend: a sandbox is a work dir plus a fresh set of namespaces per exec.

Each `exec` starts `bwrap` with new user, pid, net, ipc, uts, mount and cgroup namespaces
(`--unshare-all`), `--die-with-parent`, `--new-session` and `--disable-userns`. Inside: the
host's /usr (and the /bin, /lib, /lib64 links into it) read-only, a minimal synthetic /etc,
fresh /proc and /dev, `/`, /etc and /dev remounted read-only, size-limited tmpfs /tmp and
/dev/shm (`disk_mb` each), and the sandbox's work dir at /work; uid and
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

Not guaranteed: protection from kernel exploits (no seccomp filter beyond bwrap's own), from
timing side channels, or from CPU oversubscription (CPU time is limited per process, not CPU
share); exit codes of signalled processes are reported as bwrap reports them (128 + signal).
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import logging
import os
import random
import select
import shutil
import signal
import stat
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from rlpipe.core.errors import SandboxUnavailable
from rlpipe.sandbox import limits as limits_module
from rlpipe.sandbox import bwrap_verifier
from rlpipe.sandbox.base import ExecResult, Limits, Snapshot, VerifierRun
from rlpipe.sandbox.output import pump
from rlpipe.sandbox.warm_python import (
    SERVER_ARGV,
    WarmInterpreter,
    WarmServerDiedMidRequest,
    WarmServerLost,
    died_mid_request_result,
)
from rlpipe.sandbox.workdir import copy_tree, owner_alive, read_beneath, write_beneath

WARM_START_ATTEMPTS = 3  # consecutive failed starts of a warm interpreter before exec_python stops trying
SANDBOX_UID_BASE = 1_200_000
SANDBOX_UID_SPAN = 100_000
INSIDE_UID = 1000
_MS_NOSUID, _MS_NODEV, _MNT_DETACH = 2, 4, 2
_libc = ctypes.CDLL(None, use_errno=True)
_probed: dict[tuple[str, bool, bool], str] = {}  # (runtime root, as_root, network) -> "" if ok, else why not
# bwrap's --die-with-parent fires when the *thread* that started it ends: warm servers, which
# outlive the call that starts them, are started from this one long-lived thread
_spawner = ThreadPoolExecutor(max_workers=1, thread_name_prefix="bwrap-warm-spawner")
log = logging.getLogger(__name__)

_ETC_FILES = {
    "passwd": f"root:x:0:0::/:/usr/sbin/nologin\nsandbox:x:{INSIDE_UID}:{INSIDE_UID}::/work:/bin/sh\n",
    "group": f"root:x:0:\nsandbox:x:{INSIDE_UID}:\n",
    "hosts": "127.0.0.1 localhost sandbox\n::1 localhost\n",
    "hostname": "sandbox\n",
}
_ETC_HOST_PATHS = ["ld.so.cache", "ld.so.conf", "ld.so.conf.d", "alternatives", "localtime", "ssl", "ca-certificates"]


def default_runtime_root() -> Path:
    return Path("/tmp") / f"rlpipe-sandboxes-{os.getuid()}"


class BwrapSandbox:
    """One bubblewrap sandbox: a work dir (`/work` inside) and the limits of every exec in it."""

    def __init__(self, limits: Limits = Limits(), *, runtime_root: Path | None = None, python_prefix: str | None = None) -> None:
        self.limits = limits
        self.runtime_root = runtime_root or default_runtime_root()
        self._as_root = os.geteuid() == 0
        _require_tools()
        _prepare_runtime_root(self.runtime_root)
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
            self._make_work_dir()
            layout = limits_module.detect_cgroups() if self._as_root else None
            # RLIMIT_NPROC of this sandbox's own uid caps processes: no pids cgroup needed (saves a v1 move)
            cgroup_name = _cgroup_name(self.runtime_root, self.name)
            self.cgroups = limits_module.create_cgroups(layout, cgroup_name, limits, pids_cgroup=False) if layout else None
            self._python_prefix = python_prefix if python_prefix is not None else _default_python_prefix(self._as_root)
            self._bwrap_args = self._mount_args()
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
        return bwrap_verifier.run_verifier(self, argv, tests, timeout_s)

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
                [*self._prlimit_argv, "bwrap", *self._bwrap_args[:-2], *extra_args, *self._bwrap_args[-2:], *fds, "--", *argv],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={"PATH": "/usr/bin:/bin"}, close_fds=True,
                pass_fds=(info_write_fd, block_read_fd), process_group=0, **self._drop_privileges(),
            )
        except OSError as exc:  # the host cannot fork or exec right now: not the code's doing
            os.close(block_write_fd)
            os.close(info_read_fd)
            raise SandboxUnavailable(f"cannot start bwrap: {exc}", hint="the host is out of processes or memory") from exc
        finally:
            os.close(info_write_fd)
            os.close(block_read_fd)
        child_pid = _read_child_pid(info_read_fd)
        os.close(info_read_fd)
        failure = None
        if child_pid is not None and self.cgroups:
            try:
                self.cgroups.add(child_pid)
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
            raise SandboxUnavailable(f"cannot move the sandboxed process into {self.cgroups.memory_dir}: {failure}",
                                     hint="the sandbox's cgroup vanished; close it and make a new one") from failure
        return process, child_pid

    def write_files(self, files: dict[str, bytes]) -> None:
        for path, content in files.items():
            write_beneath(self.work_dir, path, content, uid=self.host_uid)

    def read_file(self, path: str) -> bytes:
        return read_beneath(self.work_dir, path, max_bytes=self.limits.disk_mb * 1024 * 1024)

    def snapshot(self) -> Snapshot:
        snapshot_id = f"{self.name}-{uuid.uuid4().hex[:12]}"
        target = self.runtime_root / "snapshots" / snapshot_id
        copy_tree(self.work_dir, target, uid=None)
        self._snapshots.append(target)
        return Snapshot(snapshot_id=snapshot_id)

    def restore(self, snapshot: Snapshot) -> None:
        source = self.runtime_root / "snapshots" / snapshot.snapshot_id
        if "/" in snapshot.snapshot_id or not source.is_dir():
            raise ValueError(f"no snapshot {snapshot.snapshot_id!r} under {self.runtime_root}")
        self.reset()
        copy_tree(source, self.work_dir, uid=self.host_uid)

    def reset(self) -> None:
        if self._warm is not None and self._warm[0].alive:
            # the warm server killed what each request started and emptied /tmp; it sees this
            # tmpfs through its own mount namespace, so empty it rather than mount a new one,
            # and give its root back the mode, owner and (no) xattrs of a fresh one
            try:
                self._empty_work_dir()
                self._restore_work_root()
                return
            except (OSError, RecursionError):  # e.g. dirs nested too deep for rmtree: a fresh mount
                pass
        self._stop_warm()
        if self.cgroups:
            self.cgroups.kill_all()
        if self.work_on_tmpfs:
            _umount(self.work_dir)
            self._mount_work_tmpfs()
        else:
            self._empty_work_dir()
            self._restore_work_root()

    def _restore_work_root(self) -> None:
        """The work dir's own mode, owner, times and extended attributes (ACLs among them), as made."""
        for name in os.listxattr(self.work_dir, follow_symlinks=False):
            os.removexattr(self.work_dir, name, follow_symlinks=False)
        if self._as_root:
            os.chown(self.work_dir, self.host_uid, self.host_uid)
        os.chmod(self.work_dir, 0o700)
        os.utime(self.work_dir, ns=(0, 0))  # its times could carry bits to the next user

    def _empty_work_dir(self) -> None:
        for child in list(self.work_dir.iterdir()):
            shutil.rmtree(child) if child.is_dir() and not child.is_symlink() else child.unlink()

    def close(self) -> None:
        if getattr(self, "_closed", True):
            return
        self._closed = True
        self._stop_warm()
        if getattr(self, "cgroups", None):
            self.cgroups.remove_soon()
        if self.work_on_tmpfs:
            _umount(self.work_dir)
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
        owner = f"{os.getpid()} {_start_ticks(os.getpid())}\n"
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

    def _make_work_dir(self) -> None:
        """A tmpfs of disk_mb as root; a plain dir (bounded per file only) where mounting is not allowed."""
        self.work_dir.mkdir(mode=0o700)
        if self._as_root:
            try:
                self._mount_work_tmpfs()
                self.work_on_tmpfs = True
            except SandboxUnavailable:
                os.chown(self.work_dir, self.host_uid, self.host_uid)

    def _mount_work_tmpfs(self) -> None:
        inodes = max(4096, self.limits.disk_mb * 64)
        options = f"size={self.limits.disk_mb}m,nr_inodes={inodes},mode=0700,uid={self.host_uid},gid={self.host_uid}"
        if _libc.mount(b"tmpfs", bytes(self.work_dir), b"tmpfs", _MS_NOSUID | _MS_NODEV, options.encode()) != 0:
            errno = ctypes.get_errno()
            raise SandboxUnavailable(f"cannot mount a tmpfs work dir at {self.work_dir}: {os.strerror(errno)}",
                                     hint="run as root with CAP_SYS_ADMIN, or as a non-root user (plain work dir)")

    def _mount_args(self) -> list[str]:
        args = ["--unshare-all", "--unshare-user", "--as-pid-1", "--die-with-parent", "--new-session", "--disable-userns", "--hostname", "sandbox"]
        if self.limits.network:
            args += ["--share-net", "--ro-bind-try", "/etc/resolv.conf", "/etc/resolv.conf"]
        args += ["--ro-bind", "/usr", "/usr"]
        for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
            host = Path("/") / name
            if host.is_symlink():
                args += ["--symlink", os.readlink(host), f"/{name}"]
            elif host.is_dir():
                args += ["--ro-bind", str(host), f"/{name}"]
        disk_bytes = str(self.limits.disk_mb * 1024 * 1024)
        args += ["--proc", "/proc", "--dev", "/dev", "--size", disk_bytes, "--tmpfs", "/dev/shm", "--mqueue", "/dev/mqueue",
                 "--remount-ro", "/dev"]
        args += ["--size", disk_bytes, "--tmpfs", "/tmp"]
        args += ["--dir", "/etc"]
        for name in _ETC_FILES:
            args += ["--ro-bind", str(self.runtime_root / "etc" / name), f"/etc/{name}"]
        for name in _ETC_HOST_PATHS:
            args += ["--ro-bind-try", f"/etc/{name}", f"/etc/{name}"]
        path = "/usr/local/bin:/usr/bin:/bin"
        if self._python_prefix:
            args += ["--ro-bind", self._python_prefix, self._python_prefix]
            path = f"{self._python_prefix}/bin:{path}"
        args += ["--bind", str(self.work_dir), "/work", "--chdir", "/work", "--uid", str(INSIDE_UID), "--gid", str(INSIDE_UID)]
        args += ["--clearenv", "--setenv", "PATH", path, "--setenv", "HOME", "/work", "--setenv", "LANG", "C.UTF-8",
                 "--setenv", "TMPDIR", "/tmp", "--setenv", "PYTHONDONTWRITEBYTECODE", "1"]
        return [*args, "--remount-ro", "/"]  # the root tmpfs bwrap builds: /, /etc

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

    def _kill(self, process: subprocess.Popen[bytes], child_pid: int | None) -> None:
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
        if self.cgroups:
            self.cgroups.kill_all()


def reap_leaked_sandboxes(runtime_root: Path | None = None) -> int:
    """Remove sandbox dirs (and their tmpfs, cgroups, snapshots) whose owning process is gone."""
    root = runtime_root or default_runtime_root()
    if not root.is_dir():
        return 0
    layout = limits_module.detect_cgroups() if os.geteuid() == 0 else None
    reaped = 0
    for directory in root.iterdir():
        if directory.name in ("etc", "snapshots") or owner_alive(directory / "owner"):
            continue
        if os.geteuid() == 0:
            _umount(directory / "work")
        limits_module.remove_cgroups_named(layout, _cgroup_name(root, directory.name))
        shutil.rmtree(directory, ignore_errors=True)
        for snapshot_dir in (root / "snapshots").glob(f"{directory.name}-*"):
            shutil.rmtree(snapshot_dir, ignore_errors=True)
        reaped += 1
    if layout is not None:  # cgroups whose removal thread never ran (the owner exited first)
        tag = _cgroup_name(root, "")
        for parent in {layout.memory_parent, layout.pids_parent}:
            for cgroup_dir in parent.glob(f"{limits_module.CGROUP_PREFIX}{tag}*"):
                sandbox_name = cgroup_dir.name.removeprefix(limits_module.CGROUP_PREFIX + tag)
                if not (root / sandbox_name).exists():
                    limits_module.remove_cgroups_named(layout, tag + sandbox_name)
    return reaped


def _cgroup_name(runtime_root: Path, sandbox_name: str) -> str:
    """Cgroups are host-wide: tag them with the runtime root so one root's reaper spares another's."""
    return f"{hashlib.sha256(str(runtime_root.resolve()).encode()).hexdigest()[:8]}-{sandbox_name}"


def bwrap_available() -> str:
    """"" when a BwrapSandbox can be made on this host, else the reason why not."""
    try:
        BwrapSandbox(Limits()).close()
    except SandboxUnavailable as exc:
        return str(exc)
    return ""


def _require_tools() -> None:
    for tool in ("bwrap", "prlimit"):
        if shutil.which(tool) is None:
            raise SandboxUnavailable(f"`{tool}` is not installed", hint="apt-get install bubblewrap util-linux")


def _prepare_runtime_root(root: Path) -> None:
    if os.geteuid() == 0:  # bwrap runs as an unprivileged uid that must reach root/<sandbox>/work
        for ancestor in root.resolve().parents:
            if not ancestor.stat().st_mode & stat.S_IXOTH:
                raise SandboxUnavailable(f"sandbox uids cannot reach {root}: {ancestor} is not world-searchable",
                                         hint="pick a runtime root under /tmp or /run (e.g. the default)")
    (root / "etc").mkdir(parents=True, exist_ok=True, mode=0o711)
    (root / "snapshots").mkdir(exist_ok=True, mode=0o700)
    root.chmod(0o711)
    (root / "etc").chmod(0o755)
    for name, text in _ETC_FILES.items():
        path = root / "etc" / name
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
            path.chmod(0o644)


def _default_python_prefix(as_root: bool) -> str | None:
    """The host interpreter's prefix, when not under /usr and reachable by the sandbox uid."""
    prefix = Path(sys.base_prefix).resolve()
    if prefix.is_relative_to("/usr") or not (prefix / "bin").is_dir():
        return None
    if as_root:  # bwrap runs as an unprivileged uid: every ancestor must be world-searchable
        for ancestor in [prefix, *prefix.parents]:
            if not ancestor.stat().st_mode & stat.S_IXOTH:
                return None
    return str(prefix)


def _looks_like_rlimit_oom(returncode: int, stderr: str) -> bool:
    """Without a memory cgroup, RLIMIT_AS makes allocations fail: a Python MemoryError or a SIGKILL/SIGSEGV."""
    tail = stderr.rstrip().rsplit("\n", 1)[-1]
    return tail.startswith("MemoryError") or returncode in (128 + signal.SIGSEGV,)


def _read_child_pid(info_fd: int, timeout_s: float = 10.0) -> int | None:
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


def _start_ticks(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]


def _umount(path: Path) -> None:
    _libc.umount2(bytes(path), _MNT_DETACH)
