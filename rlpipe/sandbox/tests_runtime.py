"""The tests runtime: pytest for a task's tests, offline, out of the agent's reach.

Harbor and Terminal-Bench test scripts run `pytest`, `python3 -m pytest`, `uvx ... pytest`
or `uv run pytest`, and most fetch uv and pytest from the network first. The sandboxes
have no network, so `run_verifier` (both backends) puts this runtime at RUNTIME_PATH for
the tests only:

    RUNTIME_PATH/site/     the installed copies of RUNTIME_DISTRIBUTIONS, copied from the
                           environment rlpipe runs in (their .py files and dist-info, so
                           pytest finds the pytest-json-ctrf plugin's entry point; of
                           pygments, which pytest imports, only the lexers pytest uses)
    RUNTIME_PATH/shim.py   programs/tests_shim.py
    RUNTIME_PATH/no_ptrace.py  programs/no_ptrace.py: the tests' command runs under it (no
                           process of the tests may trace another: the agent's code could
                           rewrite a check's exit status)
    RUNTIME_PATH/bin/      pytest, py.test, uvx, uv: `python3 -I RUNTIME_PATH/shim.py NAME`

and runs the tests' command with RUNTIME_PATH/bin first on PATH and RUNTIME_PATH/site first
on PYTHONPATH (`verifier_argv`), so `python3 -m pytest` finds pytest too. On bubblewrap the
folder is a read-only bind of a host copy (`host_runtime`: RUNTIME_ROOT/runtimes/DIGEST, made
once per runtime root); on
docker, root writes it into a root-owned tmpfs (mode 0755) before the tests: either way no
process of the sandbox can change it. During the agent's episode it is absent (bubblewrap)
or an empty root-owned folder (docker; after the tests it stays, read-only to the sandbox
user, until the container goes).

What it does not: install anything else, pin what a test.sh asks for (`-w pytest==8.4.1`
gets this pytest), or guard `python3 -m pytest` against a pytest.py the agent left in the
cwd (Python puts the cwd first on sys.path there; the `pytest` shim does not).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import os
import shutil
import tempfile
from pathlib import Path

from rlpipe.sandbox.programs import program_source

RUNTIME_PATH = "/.rlpipe-tests"
RUNTIME_DISTRIBUTIONS = ("pytest", "pluggy", "iniconfig", "packaging", "pytest-json-ctrf", "pygments")
_PYGMENTS_LEXERS = ("__init__.py", "_mapping.py", "python.py", "diff.py")  # what pytest's terminal writer imports
SHIMS = ("pytest", "py.test", "uvx", "uv")


@functools.cache
def runtime_files() -> dict[str, bytes]:
    """Relative path -> bytes of the whole runtime (a distribution that is not installed is left out)."""
    files: dict[str, bytes] = {}
    for name in RUNTIME_DISTRIBUTIONS:
        try:
            distribution = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        for entry in distribution.files or []:
            relative = entry.as_posix()
            if relative.startswith("..") or "__pycache__" in relative or relative.endswith(".pyc"):
                continue
            if relative.startswith("pygments/lexers/") and relative.removeprefix("pygments/lexers/") not in _PYGMENTS_LEXERS:
                continue  # 8 MB of lexers pytest never loads
            path = Path(str(distribution.locate_file(entry)))
            if path.is_file():
                files[f"site/{relative}"] = path.read_bytes()
    files["shim.py"] = program_source("programs/tests_shim.py").encode()
    files["no_ptrace.py"] = program_source("programs/no_ptrace.py").encode()
    for shim in SHIMS:
        files[f"bin/{shim}"] = f'#!/bin/sh\nexec python3 -I {RUNTIME_PATH}/shim.py {shim} "$@"\n'.encode()
    return files


def runtime_digest() -> str:
    digest = hashlib.sha256()
    for path, data in sorted(runtime_files().items()):
        digest.update(f"{path}\0{len(data)}\0".encode())
        digest.update(data)
    return digest.hexdigest()[:16]


def host_runtime(root: Path) -> Path:
    """The runtime as a folder under `root`/runtimes (made once: a later call finds it), readable
    and runnable by every uid, writable by this process's uid only."""
    folder = root / "runtimes"
    folder.mkdir(mode=0o755, exist_ok=True)
    target = folder / runtime_digest()
    if target.is_dir():
        return target
    staging = Path(tempfile.mkdtemp(prefix="staging-", dir=folder))
    try:
        for relative, data in runtime_files().items():
            path = staging / relative
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
            path.write_bytes(data)
            path.chmod(0o755 if relative.startswith("bin/") else 0o644)
        for folder, _, _ in os.walk(staging):
            os.chmod(folder, 0o755)
        os.rename(staging, target)
    except OSError:
        if not target.is_dir():
            raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def verifier_argv(argv: list[str]) -> list[str]:
    """`argv` with the runtime's bin first on PATH and its site first on PYTHONPATH, under a
    seccomp filter that forbids every process of the tests to trace another (no_ptrace.py)."""
    script = (f'PATH="{RUNTIME_PATH}/bin:$PATH"; PYTHONPATH="{RUNTIME_PATH}/site${{PYTHONPATH:+:$PYTHONPATH}}"; '
              'export PATH PYTHONPATH; exec "$@"')
    return ["python3", "-I", "-S", f"{RUNTIME_PATH}/no_ptrace.py", "/bin/sh", "-c", script, "rlpipe-tests", *argv]
