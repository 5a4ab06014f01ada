"""The sandbox attack suite: one adversarial program per guarantee, for any backend.

`ATTACKS` is data (a guarantee name, what it checks, a function); `run_selftest(factory)`
runs them against sandboxes made by `factory(limits)` and returns one `AttackOutcome`
each. An attack that makes the sandbox *raise* has not been contained (a sandbox returns
an ExecResult for anything the code does), so it counts as not held.

Host-side checks use only loopback (a TCP listener on 127.0.0.1) and this machine's own
files and processes. What it does not test: kernel exploits, side channels, CPU share.
"""

from __future__ import annotations

import json
import os
import resource
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from rlpipe.sandbox import attacks
from rlpipe.sandbox.base import ExecResult, Limits, Sandbox

SandboxFactory = Callable[[Limits], Sandbox]

SELFTEST_LIMITS = Limits(timeout_s=5.0, memory_mb=128, cpu_time_s=10, max_processes=32, disk_mb=16,
                         output_bytes=1_000_000, network=False)
_PROJECT_DIR = Path(__file__).resolve().parents[2]
_PROCESS_SLACK = 4


@dataclass(frozen=True)
class AttackOutcome:
    guarantee: str
    held: bool
    detail: str


@dataclass(frozen=True)
class Attack:
    guarantee: str
    description: str
    check: Callable[[SandboxFactory], AttackOutcome]


def _python(sandbox: Sandbox, program: str, *args: str, timeout_s: float | None = None) -> ExecResult:
    return sandbox.exec(["python3", "-c", program, *args], timeout_s=timeout_s)


def _last_json(result: ExecResult) -> dict:
    for line in reversed(result.stdout.strip().splitlines()):
        try:
            return json.loads(line)
        except json.JSONDecodeError:
            continue
    return {}


def _sandbox(factory: SandboxFactory, **changes: object):
    return _Closing(factory(replace(SELFTEST_LIMITS, **changes)))


class _Closing:
    def __init__(self, sandbox: Sandbox) -> None:
        self.sandbox = sandbox

    def __enter__(self) -> Sandbox:
        return self.sandbox

    def __exit__(self, *exc_info: object) -> None:
        self.sandbox.close()


def fork_bomb(factory: SandboxFactory) -> AttackOutcome:
    with _sandbox(factory, max_processes=32) as sandbox:
        result = _python(sandbox, attacks.FORK_BOMB, timeout_s=20)
    forks = _last_json(result).get("forks")
    # a backend may count its own helpers (an init, an exec shim) apart from the limit: allow a few
    held = forks is not None and forks <= 32 + _PROCESS_SLACK and not result.timed_out
    return AttackOutcome("fork_bomb", held, f"forks before refusal: {forks} (limit 32 + {_PROCESS_SLACK} slack); {_brief(result)}")


def memory_bomb(factory: SandboxFactory) -> AttackOutcome:
    with _sandbox(factory, memory_mb=128) as sandbox:
        result = _python(sandbox, attacks.MEMORY_BOMB, "1024", timeout_s=30)
    held = "allocated" not in result.stdout and result.exit_code != 0
    return AttackOutcome("memory_bomb", held, f"asked 1024 MB with a 128 MB limit; oom_killed={result.oom_killed}; {_brief(result)}")


def disk_fill(factory: SandboxFactory) -> AttackOutcome:
    with _sandbox(factory, disk_mb=16) as sandbox:
        result = _python(sandbox, attacks.DISK_FILL, timeout_s=30)
    written = _last_json(result)
    mib = 1 << 20
    held = bool(written) and all(written.get(d, 1 << 40) <= 20 * mib for d in ("/work", "/tmp"))
    return AttackOutcome("disk_fill", held, f"bytes written before refusal with a 16 MB disk: {written}")


def infinite_loop(factory: SandboxFactory) -> AttackOutcome:
    with _sandbox(factory) as sandbox:
        result = _python(sandbox, attacks.INFINITE_LOOP, timeout_s=1.5)
    held = result.timed_out and result.exit_code is None and result.duration_s < 4.0
    return AttackOutcome("infinite_loop", held, f"killed at the 1.5 s wall clock: {_brief(result)}")


def cpu_time(factory: SandboxFactory) -> AttackOutcome:
    with _sandbox(factory, cpu_time_s=1, timeout_s=20) as sandbox:
        result = _python(sandbox, attacks.INFINITE_LOOP)
    held = not result.timed_out and result.exit_code != 0 and result.duration_s < 6.0
    return AttackOutcome("cpu_time", held, f"stopped by the 1 s CPU-time limit (wall limit 20 s): {_brief(result)}")


def sleep_forever(factory: SandboxFactory) -> AttackOutcome:
    with _sandbox(factory) as sandbox:
        result = _python(sandbox, attacks.SLEEP_FOREVER, timeout_s=1.0)
    held = result.timed_out and result.exit_code is None and result.duration_s < 3.5
    return AttackOutcome("sleep_forever", held, f"killed at the 1 s wall clock: {_brief(result)}")


def network_egress(factory: SandboxFactory) -> AttackOutcome:
    accepted: list[bytes] = []
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(4)
        listener.settimeout(0.2)
        stop = threading.Event()
        thread = threading.Thread(target=_accept_until, args=(listener, stop, accepted), daemon=True)
        thread.start()
        try:
            with _sandbox(factory) as sandbox:
                result = _python(sandbox, attacks.NETWORK_EGRESS, str(listener.getsockname()[1]), timeout_s=10)
        finally:
            stop.set()
            thread.join()
    outcome = _last_json(result)
    held = outcome.get("connected") is False and outcome.get("interfaces") == ["lo"] and not accepted
    return AttackOutcome("network_egress", held, f"host listener got {len(accepted)} connections; inside: {outcome}")


def _accept_until(listener: socket.socket, stop: threading.Event, accepted: list[bytes]) -> None:
    while not stop.is_set():
        try:
            connection, _ = listener.accept()
        except OSError:
            continue
        with connection:
            accepted.append(connection.recv(64))


def write_outside_workdir(factory: SandboxFactory) -> AttackOutcome:
    marker = f"rlpipe-selftest-{uuid.uuid4().hex[:8]}"
    with _sandbox(factory) as sandbox:
        result = _python(sandbox, attacks.WRITE_OUTSIDE, marker)
    inside = _last_json(result).get("written")
    on_host = [str(path) for path in (Path("/usr") / marker, Path("/etc") / marker, Path("/") / marker,
                                      Path("/tmp") / marker) if path.exists()]
    held = inside == [] and not on_host
    return AttackOutcome("write_outside_workdir", held, f"written inside: {inside}; on the host: {on_host}")


def read_host_files(factory: SandboxFactory) -> AttackOutcome:
    paths = ["/root", str(_PROJECT_DIR), str(_PROJECT_DIR / "pyproject.toml"), "/home", "/etc/shadow"]
    with _sandbox(factory) as sandbox:
        result = _python(sandbox, attacks.READ_HOST_FILES, *paths)
    readable = _last_json(result).get("readable")
    held = readable == []
    return AttackOutcome("read_host_files", held, f"readable inside: {readable}; {_brief(result)}")


def host_environment(factory: SandboxFactory) -> AttackOutcome:
    secret = f"secret-{uuid.uuid4().hex}"
    os.environ["RLPIPE_SELFTEST_SECRET"] = secret
    try:
        with _sandbox(factory) as sandbox:
            result = _python(sandbox, attacks.PRINT_ENVIRONMENT)
    finally:
        del os.environ["RLPIPE_SELFTEST_SECRET"]
    environment = _last_json(result)
    held = bool(environment) and secret not in result.stdout and "RLPIPE_SELFTEST_SECRET" not in environment
    return AttackOutcome("host_environment", held, f"variables inside: {sorted(environment)}")


def huge_stdout(factory: SandboxFactory) -> AttackOutcome:
    rss_before_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with _sandbox(factory, output_bytes=1_000_000) as sandbox:
        result = _python(sandbox, attacks.HUGE_STDOUT, timeout_s=30)
    growth_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before_kb) / 1024
    held = result.stdout_truncated and len(result.stdout) <= 1_000_000 and result.exit_code == 0 and growth_mb < 50
    return AttackOutcome("huge_stdout", held, f"100 MB written, {len(result.stdout)} chars kept, truncated="
                         f"{result.stdout_truncated}, host peak RSS grew {growth_mb:.0f} MB; {_brief(result)}")


def double_fork(factory: SandboxFactory) -> AttackOutcome:
    with _sandbox(factory) as sandbox:
        result = _python(sandbox, attacks.DOUBLE_FORK)
        beats_at_exit = len(_read_or_empty(sandbox, "heartbeat"))
        time.sleep(0.5)
        beats_later = len(_read_or_empty(sandbox, "heartbeat"))
    held = result.exit_code == 0 and beats_at_exit > 0 and beats_later == beats_at_exit
    return AttackOutcome("double_fork", held, f"grandchild heartbeats: {beats_at_exit} when exec returned, "
                         f"{beats_later} 0.5 s later (must not grow)")


def _read_or_empty(sandbox: Sandbox, path: str) -> bytes:
    try:
        return sandbox.read_file(path)
    except (FileNotFoundError, OSError):
        return b""


def exit_codes(factory: SandboxFactory) -> AttackOutcome:
    seen: dict[str, int | None] = {}
    with _sandbox(factory) as sandbox:
        for name, (program, _) in attacks.EXIT_CODE_PROGRAMS.items():
            seen[name] = _python(sandbox, program).exit_code
    expected = {name: code for name, (_, code) in attacks.EXIT_CODE_PROGRAMS.items()}
    return AttackOutcome("exit_codes_exact", seen == expected, f"reported {seen}, expected {expected}")


def planted_symlinks(factory: SandboxFactory) -> AttackOutcome:
    host_hostname = Path("/etc/hostname").read_bytes() if Path("/etc/hostname").exists() else b""
    leaks: list[str] = []
    with _sandbox(factory) as sandbox:
        _python(sandbox, attacks.PLANT_SYMLINKS)
        try:
            if sandbox.read_file("read-me") == host_hostname and host_hostname:
                leaks.append("read_file followed read-me -> /etc/hostname on the host")
        except (OSError, ValueError):
            pass
        try:
            sandbox.write_files({"dir-link/rlpipe-planted": b"x"})
        except (OSError, ValueError):
            pass
        if Path("/tmp/rlpipe-planted").exists():
            leaks.append("write_files followed dir-link -> /tmp on the host")
            Path("/tmp/rlpipe-planted").unlink()
    return AttackOutcome("planted_symlinks", not leaks, "; ".join(leaks) or "host-side reads and writes refused the links")


def _brief(result: ExecResult) -> str:
    stderr_tail = result.stderr.strip().splitlines()[-1:] if result.stderr.strip() else []
    return (f"exit={result.exit_code} timed_out={result.timed_out} oom={result.oom_killed} "
            f"{result.duration_s:.2f}s {stderr_tail[0][:120] if stderr_tail else ''}").strip()


ATTACKS: list[Attack] = [
    Attack("fork_bomb", "forking without end stops at the process limit", fork_bomb),
    Attack("memory_bomb", "allocating 8x the memory limit fails", memory_bomb),
    Attack("disk_fill", "filling /work and /tmp stops at disk_mb", disk_fill),
    Attack("infinite_loop", "a busy loop is killed at the wall-clock timeout", infinite_loop),
    Attack("cpu_time", "a busy loop is stopped by the CPU-time limit", cpu_time),
    Attack("sleep_forever", "a sleeping process is killed at the wall-clock timeout", sleep_forever),
    Attack("network_egress", "no route to the host's loopback; only a private lo inside", network_egress),
    Attack("write_outside_workdir", "the system is read-only; nothing written inside reaches the host", write_outside_workdir),
    Attack("read_host_files", "/root, /home, the project and /etc/shadow are not visible", read_host_files),
    Attack("host_environment", "the host's environment variables do not reach the sandbox", host_environment),
    Attack("huge_stdout", "100 MB of stdout is cut at output_bytes without buffering it", huge_stdout),
    Attack("double_fork", "a daemonized grandchild does not outlive its exec", double_fork),
    Attack("exit_codes_exact", "exit codes are reported exactly (sys.exit, os._exit, exceptions)", exit_codes),
    Attack("planted_symlinks", "host-side read_file/write_files do not follow symlinks planted inside", planted_symlinks),
]


PATHS = ("exec", "exec_python")  # how the attack programs are run: a plain exec, or the warm path


def run_attack(attack: Attack, factory: SandboxFactory, path: str = "exec") -> AttackOutcome:
    """Run one attack; a sandbox that raises instead of containing the code has not held.

    With path="exec_python", each `python3 -c PROGRAM ARGS` of the attack goes through
    `Sandbox.exec_python` instead (bubblewrap forks it from a warm interpreter).
    """
    if path not in PATHS:
        raise ValueError(f"unknown path {path!r}; one of {PATHS}")
    if path == "exec_python":
        factory = _through_exec_python(factory)
    try:
        outcome = attack.check(factory)
    except Exception as exc:  # noqa: BLE001 - any exception is the finding
        return AttackOutcome(attack.guarantee, False, f"the sandbox raised {type(exc).__name__}: {exc}")
    responsive_s = _host_fork_latency_s()
    if responsive_s > 2.0:
        return replace(outcome, held=False, detail=f"host unresponsive afterwards ({responsive_s:.1f} s to run `true`); {outcome.detail}")
    return outcome


def run_selftest(factory: SandboxFactory, attacks_to_run: list[Attack] | None = None, path: str = "exec") -> list[AttackOutcome]:
    return [run_attack(attack, factory, path) for attack in (attacks_to_run or ATTACKS)]


def _through_exec_python(factory: SandboxFactory) -> SandboxFactory:
    return lambda limits: _PythonByExecPython(factory(limits))


class _PythonByExecPython:
    """A sandbox whose `python3 -c PROGRAM ARGS` execs go through its `exec_python`; all else as is."""

    def __init__(self, sandbox: Sandbox) -> None:
        self._sandbox = sandbox

    def exec(self, argv: list[str], stdin: bytes = b"", timeout_s: float | None = None) -> ExecResult:
        if argv[:2] == ["python3", "-c"] and len(argv) >= 3:
            return self._sandbox.exec_python(argv[2], stdin, timeout_s, args=argv[3:])
        return self._sandbox.exec(argv, stdin, timeout_s)

    def __getattr__(self, name: str) -> object:
        return getattr(self._sandbox, name)


def _host_fork_latency_s() -> float:
    started = time.monotonic()
    subprocess.run(["true"], check=False)
    return time.monotonic() - started
