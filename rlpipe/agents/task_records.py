"""What a task folder becomes, and the readers every task format shares (Harbor's
task_format.py, Terminal-Bench 1's task_tb1.py).

- records: `TaskLimits` (a trial's quotas), `AgentTask` (a runnable task, files in memory),
  `SkippedTask` (a folder that will not run, and why), and the limits' defaults;
- readers: `read_text` (UTF-8 or a DatasetError), `read_tree` (every regular file under a
  folder; a symlink is a DatasetError), `positive_number`, `required_commands` (declared
  commands plus the interpreters of test.sh's and solve.sh's #! lines), `task_workdir`
  (where a task's files are), `shebang_interpreter`.

What it does not: decide which format a folder is, or load one (task_format.py, task_tb1.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from rlpipe.core.errors import DatasetError
from rlpipe.sandbox.base import WORK

MAX_TASK_BYTES = 16 * 1024 * 1024  # all files of one task folder together
DEFAULT_AGENT_TIMEOUT_S = 600.0
DEFAULT_VERIFIER_TIMEOUT_S = 120.0
DEFAULT_MAX_STEPS = 50
DEFAULT_MEMORY_MB = 1024  # Harbor's default is 2 GB; trials here are many and small
DEFAULT_STORAGE_MB = 256  # Harbor's default is 10 GB (the work dir is a tmpfs here)
_SHEBANG_COMMANDS = ("bash", "sh", "python3")
_MENTIONS_APP = re.compile(rb"(?<![\w./-])/app(?=/|\b)")
_WORKDIR_LINE = re.compile(r"^\s*WORKDIR\s+(\S+)\s*$", re.IGNORECASE | re.MULTILINE)


@dataclass(frozen=True)
class TaskLimits:
    """The quotas of one trial."""

    cpus: float = 1.0
    memory_mb: int = DEFAULT_MEMORY_MB
    storage_mb: int = DEFAULT_STORAGE_MB
    agent_timeout_s: float = DEFAULT_AGENT_TIMEOUT_S
    verifier_timeout_s: float = DEFAULT_VERIFIER_TIMEOUT_S
    max_steps: int = DEFAULT_MAX_STEPS


@dataclass(frozen=True)
class AgentTask:
    """One runnable task: everything a trial needs, read into memory (paths are relative)."""

    task_id: str
    folder: Path
    instruction: str
    initial_files: dict[str, bytes]
    executable_files: tuple[str, ...]  # initial files whose mode had an execute bit
    setup_script: str | None  # path under environment/ (also in initial_files), run then removed
    solution_files: dict[str, bytes]  # solution/..., empty when the task has no reference
    test_files: dict[str, bytes]  # tests/..., copied in only after the agent ends
    limits: TaskLimits
    requires_commands: tuple[str, ...]
    category: str = ""
    difficulty: str = ""
    tags: tuple[str, ...] = field(default_factory=tuple)
    workdir: str = WORK  # where the task's files are: the agent's cwd (the work dir is at /work too)
    dockerfile: str | None = None  # environment/Dockerfile's text: initial_files are then its build context


@dataclass(frozen=True)
class SkippedTask:
    """A folder that will not be run: why (`invalid` when it is not a well-formed task)."""

    task_id: str
    folder: Path
    reason: str
    invalid: bool = False


def task_workdir(environment: dict, dockerfile: str | None, texts: list[bytes], folder: Path) -> str:
    """The task's work dir (see the module docstring)."""
    declared = environment.get("workdir")
    if declared is not None:
        if not isinstance(declared, str):
            raise DatasetError(f"{folder / 'task.toml'}: workdir = {declared!r} must be a path",
                               hint='e.g. workdir = "/app"')
        return declared.rstrip("/") or "/"
    if dockerfile is not None:
        current = "/"
        for target in _WORKDIR_LINE.findall(dockerfile):
            current = str(PurePosixPath(current) / target.strip('"'))
        return current if current != "/" else "/app"
    return "/app" if any(_MENTIONS_APP.search(text) for text in texts) else WORK


def read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise DatasetError(f"{path} is not UTF-8 text ({exc.reason} at byte {exc.start})", hint="save it as UTF-8") from exc


def positive_number(section: dict, key: str, default: float, folder: Path) -> float:
    value = section.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise DatasetError(f"{folder / 'task.toml'}: {key} = {value!r} must be a positive number",
                           hint=f"e.g. {key} = {default}")
    return float(value)


def read_tree(root: Path) -> tuple[dict[str, bytes], tuple[str, ...]]:
    """Every regular file under root (relative POSIX paths) and those with an execute bit.
    Python's bytecode caches (`__pycache__` folders, left by running a task's check.py where
    it lies) are not the task's: left out, so a task is the same task whether or not it ran."""
    files: dict[str, bytes] = {}
    executable = []
    if not root.is_dir():
        return files, ()
    for path in sorted(root.rglob("*")):
        if "__pycache__" in path.relative_to(root).parts:
            continue
        if path.is_symlink():
            raise DatasetError(f"{path} is a symbolic link; task folders hold regular files only",
                               hint="replace the link by a copy of the file")
        if path.is_file():
            relative = path.relative_to(root).as_posix()
            files[relative] = path.read_bytes()
            if path.stat().st_mode & 0o111:
                executable.append(relative)
    return files, tuple(executable)


def required_commands(environment: dict, test_files: dict[str, bytes], solution_files: dict[str, bytes], folder: Path) -> tuple[str, ...]:
    """Commands the task names in requires_commands, plus the interpreters of its scripts' #! lines."""
    declared = environment.get("requires_commands", [])
    if not isinstance(declared, list) or not all(isinstance(name, str) and re.fullmatch(r"[\w.+-]+", name) for name in declared):
        raise DatasetError(f"{folder / 'task.toml'}: requires_commands = {declared!r} must be a list of command names",
                           hint='e.g. requires_commands = ["git", "make"]')
    needed = set(declared) | {"sh"}
    for script in (test_files.get("test.sh"), solution_files.get("solve.sh")):
        needed |= set(shebang_interpreter(script))
    return tuple(sorted(needed))


def shebang_interpreter(script: bytes | None) -> tuple[str, ...]:
    """The interpreter a script's #! line names (`bash` for `#!/usr/bin/env bash`), or ()."""
    if not script or not script.startswith(b"#!"):
        return ()
    words = script.split(b"\n", 1)[0][2:].decode(errors="replace").split()
    if not words:
        return ()
    name = words[1] if words[0].endswith("/env") and len(words) > 1 else words[0].rsplit("/", 1)[-1]
    return (name,) if name in _SHEBANG_COMMANDS else ()
