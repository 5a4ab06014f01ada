"""A task's tests on a docker sandbox's state, out of the reach of what ran there before.

`run_verifier(sandbox, argv, tests, timeout_s)` (DockerSandbox.run_verifier):

    1. (by the caller, DockerSandbox.run_verifier) every process of the sandbox user is
       killed, the warm server included, so none sees the tests arrive;
    2. as root without capabilities (docker_stream.ROOT), programs/docker_verifier.py writes
       the tests to /tests and makes /logs/verifier and /logs/agent: /tests and /logs are
       root's tmpfs mounts (mode 0755), so the sandbox user can read the tests but not
       change them, and cannot replace the logs folders;
    3. the tests runtime (tests_runtime.py: pytest, uvx and uv shims) is written by root into
       /.rlpipe-tests, a root-owned tmpfs, once per container;
       argv runs as the sandbox user, its PATH and PYTHONPATH led by the runtime (docker_stream.TESTS: HOME=/tmp, PYTHONNOUSERSITE=1),
       unwrapped: it is the exec's own process, so a test.sh may `kill -9 -1` what it
       started without ending its caller; then every process of the user is killed, and in
       the same exec the user opens up what its processes made under /logs (OPEN_THE_LOGS:
       root without capabilities could not remove a folder the tests' code left mode 0555,
       and the failed clean-up would turn the agent's failure into a retried sandbox error);
    4. root reads the regular files of /logs/verifier (no symlink followed, at most
       VERIFIER_LOG_BYTES each) and empties /tests and /logs, in the same exec (or, where
       the run failed before it, empties them alone).

What it does not: choose the command or interpret the reward (agents/verifier.py).
"""

from __future__ import annotations

from collections.abc import Callable

from rlpipe.core.errors import SandboxUnavailable
from rlpipe.sandbox.base import ExecResult, VerifierRun
from rlpipe.sandbox.docker_stream import ROOT, TESTS, RawRun
from rlpipe.sandbox.programs import docker_work, program_source
from rlpipe.sandbox.tests_runtime import runtime_files, verifier_argv

PROGRAM = ["python3", "-I", "-S", "-c", program_source("programs/docker_verifier.py")]
# run by the sandbox user once none of its processes is left (after the tests); a symlink is
# not followed, and what it cannot change (none of its own) root clears anyway
OPEN_THE_LOGS = "chmod -R a+rwX /logs/verifier /logs/agent 2>/dev/null"
RunAs = Callable[..., RawRun]
"""DockerSandbox._run: (argv, stdin, timeout_s, bytes kept of each stream, identity=...) -> the raw run."""


def run_verifier(run: RunAs, kill_everything: Callable[[str], None], argv: list[str], tests: dict[str, bytes],
                 timeout_s: float, output_bytes: int) -> VerifierRun:
    """Steps 2-4 of the module docstring; the caller has done step 1 (no process of the user left)."""
    cleared = False
    try:
        runtime = docker_work.frames(runtime_files())
        _ours(run, "setup", len(runtime).to_bytes(8, "big") + runtime + docker_work.frames(tests),
              "put the tests and their runtime in place")
        raw = run(verifier_argv(list(argv)), b"", timeout_s, output_bytes, identity=TESTS)
        kill_everything(OPEN_THE_LOGS)
        result = ExecResult(
            exit_code=None if raw.timed_out else raw.exit_code,
            stdout=raw.stdout.decode("utf-8", errors="replace"), stderr=raw.stderr.decode("utf-8", errors="replace"),
            stdout_truncated=raw.stdout_truncated, stderr_truncated=raw.stderr_truncated,
            duration_s=raw.duration_s, timed_out=raw.timed_out, oom_killed=False)
        logs = unframe(_ours(run, "logs", b"", "read the tests' logs and remove the tests"))
        cleared = True
    finally:
        if not cleared:
            _ours(run, "clear", b"", "remove the tests")
    return VerifierRun(result, logs)


def _ours(run: RunAs, action: str, stdin: bytes, what: str) -> bytes:
    raw = run([*PROGRAM, action], stdin, 60.0, None, identity=ROOT)
    if raw.exit_code != 0:
        raise SandboxUnavailable(f"docker sandbox could not {what}: {raw.stderr[-500:].decode(errors='replace')}",
                                 hint="check `docker info`; the container may be gone")
    return raw.stdout


def unframe(data: bytes) -> dict[str, bytes]:
    """docker_work.frames' form back to {name: bytes}."""
    files, at = {}, 0
    while at + 12 <= len(data):
        name_size, size = int.from_bytes(data[at:at + 4], "big"), int.from_bytes(data[at + 4:at + 12], "big")
        files[data[at + 12:at + 12 + name_size].decode(errors="replace")] = data[at + 12 + name_size:at + 12 + name_size + size]
        at += 12 + name_size + size
    return files
