"""Load Harbor-format task folders into typed records.

A task folder (Harbor layout; Terminal-Bench 1 folders are task_tb1.py's):

    task.toml            limits and metadata (every key optional)
    instruction.md       what the agent is asked to do
    environment/         initial files, copied into the work dir; or, with a Dockerfile,
                         the build context of the task's image (agents/task_env.py)
    solution/solve.sh    the reference solution (run by the `oracle` agent)
    tests/test.sh        the verifier; writes a reward to /logs/verifier/reward.txt (or .json)

What `task.toml` may set (Harbor's keys, plus rlpipe's marked +):

    [agent]       timeout_sec, max_steps (+)
    [verifier]    timeout_sec
    [environment] cpus, memory / memory_mb, storage / storage_mb, gpus, allow_internet,
                  requires_commands (+): commands the task needs in the sandbox,
                  setup_script (+): a script in environment/ run once before the agent
                  starts, then deleted (what a Dockerfile's RUN would do),
                  workdir (+): where the task's files are (the agent's cwd)
    [metadata]    category, difficulty, tags (free-form; kept for reports)

The work dir (`AgentTask.workdir`): task.toml's workdir, else the Dockerfile's last WORKDIR
(/app when it names none), else /app when the instruction, tests or solution name /app,
else /work (the built-in suite's). The sandbox's work dir is seen at that path.

`load_task` raises DatasetError for a folder that is not a task (no instruction.md, no
tests/test.sh, bad TOML, a value of the wrong type), naming the file and the key; it
returns a SkippedTask with the reason for a task this harness cannot run as written:
an `environment/docker-compose.yaml` (several containers), `allow_internet = true`,
`gpus > 0`, or a work dir no sandbox can host (/usr/..., /tmp/...). Whether a Dockerfile can
be honoured is decided per backend when the trial starts (agents/task_env.py).
`load_tasks` never raises for one bad folder among many: it turns it into a SkippedTask
marked invalid; a folder that is neither a Harbor nor a Terminal-Bench 1 task is reported
as an invalid SkippedTask too, never dropped.

What it does not do: check that the required commands exist in a sandbox (the trial does
that, per backend: agents/backends.py), or run anything.
"""

from __future__ import annotations

import re
import tomllib
from importlib import resources
from pathlib import Path

from rlpipe.core.errors import DatasetError
from rlpipe.agents.task_records import (
    DEFAULT_AGENT_TIMEOUT_S,
    DEFAULT_MAX_STEPS,
    DEFAULT_MEMORY_MB,
    DEFAULT_STORAGE_MB,
    DEFAULT_VERIFIER_TIMEOUT_S,
    MAX_TASK_BYTES,
    AgentTask,
    SkippedTask,
    TaskLimits,
    positive_number,
    read_text,
    read_tree,
    required_commands,
    task_workdir,
)
from rlpipe.sandbox.base import workspace_problem

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)i?B?\s*$", re.IGNORECASE)


def builtin_suite_dir() -> Path:
    """The folder of the built-in suite (package data)."""
    return Path(str(resources.files("rlpipe.agents") / "suite"))


def is_task_folder(path: Path) -> bool:
    """A Harbor task (task.toml or instruction.md) or a Terminal-Bench 1 task (task.yaml)."""
    return (path / "task.toml").is_file() or (path / "instruction.md").is_file() or (path / "task.yaml").is_file()


def load_tasks(directory: Path) -> list[AgentTask | SkippedTask]:
    """Every task under `directory` (itself a task folder, or a folder of them), sorted by id.

    Raises DatasetError when `directory` is missing or holds no task folder at all.
    """
    if not directory.is_dir():
        raise DatasetError(f"task folder {directory} does not exist or is not a directory",
                           hint="pass a Harbor-format task folder, or a folder of them: --tasks DIR")
    if is_task_folder(directory):
        folders, others = [directory], []
    else:
        children = sorted(p for p in directory.iterdir() if p.is_dir() and not p.name.startswith((".", "__")))
        folders, others = [p for p in children if is_task_folder(p)], [p for p in children if not is_task_folder(p)]
    if not folders:
        raise DatasetError(f"{directory} holds no task folder (none has a task.toml, an instruction.md or a task.yaml)",
                           hint="each task is a folder with task.toml, instruction.md, environment/, solution/solve.sh, tests/test.sh")
    loaded: list[AgentTask | SkippedTask] = [
        SkippedTask(other.name, other, "invalid task: neither a Harbor task (no task.toml or instruction.md) nor a "
                    "Terminal-Bench 1 task (no task.yaml)", invalid=True) for other in others]
    for folder in folders:
        try:
            loaded.append(load_task(folder))
        except DatasetError as exc:
            loaded.append(SkippedTask(folder.name, folder, f"invalid task: {exc.message}", invalid=True))
    return sorted(loaded, key=lambda task: task.task_id)


def load_task(folder: Path) -> AgentTask | SkippedTask:
    """One task folder -> AgentTask, or SkippedTask with the reason; DatasetError if malformed."""
    if (folder / "task.yaml").is_file() and not (folder / "instruction.md").is_file():
        from rlpipe.agents.task_tb1 import load_tb1_task

        return load_tb1_task(folder)
    task_id = folder.name
    config = _read_config(folder)
    instruction_path = folder / "instruction.md"
    if not instruction_path.is_file():
        raise DatasetError(f"{instruction_path} is missing", hint="every task needs an instruction.md with what the agent must do")
    instruction = read_text(instruction_path).strip()
    if not instruction:
        raise DatasetError(f"{instruction_path} is empty", hint="write what the agent must do in instruction.md")
    if not (folder / "tests" / "test.sh").is_file():
        raise DatasetError(f"{folder / 'tests' / 'test.sh'} is missing",
                           hint="every task needs tests/test.sh, which writes a reward to /logs/verifier/reward.txt")
    environment = _section(config, "environment", folder)
    agent = _section(config, "agent", folder)
    verifier = _section(config, "verifier", folder)
    metadata = _section(config, "metadata", folder)
    skip_reason = _unsupported_environment(folder, environment)
    if skip_reason:
        return SkippedTask(task_id, folder, skip_reason)
    limits = TaskLimits(
        cpus=positive_number(environment, "cpus", 1.0, folder),
        memory_mb=_megabytes(environment, "memory", "memory_mb", DEFAULT_MEMORY_MB, folder),
        storage_mb=_megabytes(environment, "storage", "storage_mb", DEFAULT_STORAGE_MB, folder),
        agent_timeout_s=positive_number(agent, "timeout_sec", DEFAULT_AGENT_TIMEOUT_S, folder),
        verifier_timeout_s=positive_number(verifier, "timeout_sec", DEFAULT_VERIFIER_TIMEOUT_S, folder),
        max_steps=int(positive_number(agent, "max_steps", DEFAULT_MAX_STEPS, folder)),
    )
    initial_files, executable = read_tree(folder / "environment")
    test_files, _ = read_tree(folder / "tests")
    solution_files, _ = read_tree(folder / "solution")
    total = sum(map(len, initial_files.values())) + sum(map(len, test_files.values())) + sum(map(len, solution_files.values()))
    if total > MAX_TASK_BYTES:
        raise DatasetError(f"{folder} holds {total} bytes of files; at most {MAX_TASK_BYTES} are loaded",
                           hint="keep task folders small: generate large inputs in a setup_script")
    setup_script = environment.get("setup_script")
    if setup_script is not None and (not isinstance(setup_script, str) or setup_script not in initial_files):
        raise DatasetError(f"{folder / 'task.toml'}: [environment] setup_script = {setup_script!r} is not a file in environment/",
                           hint="name a script under environment/, e.g. setup_script = \"setup.sh\"")
    dockerfile = initial_files.get("Dockerfile")
    dockerfile_text = dockerfile.decode("utf-8", errors="replace") if dockerfile is not None else None
    workdir = task_workdir(environment, dockerfile_text, [instruction.encode(), *test_files.values(), *solution_files.values()], folder)
    problem = workspace_problem(workdir)
    if problem:
        return SkippedTask(task_id, folder, f"{problem}: set [environment] workdir in task.toml, e.g. \"/app\"")
    return AgentTask(
        task_id=task_id, folder=folder, instruction=instruction, initial_files=initial_files,
        executable_files=executable, setup_script=setup_script, solution_files=solution_files,
        test_files=test_files, limits=limits,
        requires_commands=required_commands(environment, test_files, solution_files, folder),
        category=str(metadata.get("category", "")), difficulty=str(metadata.get("difficulty", "")),
        tags=tuple(str(tag) for tag in metadata.get("tags", []) or []),
        workdir=workdir, dockerfile=dockerfile_text,
    )


def _read_config(folder: Path) -> dict:
    path = folder / "task.toml"
    if not path.is_file():
        return {}
    try:
        return tomllib.loads(read_text(path))
    except tomllib.TOMLDecodeError as exc:
        raise DatasetError(f"{path} is not valid TOML: {exc}", hint="fix the syntax (see docs/AGENTS.md for the keys)") from exc


def _section(config: dict, name: str, folder: Path) -> dict:
    value = config.get(name, {})
    if not isinstance(value, dict):
        raise DatasetError(f"{folder / 'task.toml'}: {name} must be a table ([{name}]), not {type(value).__name__}",
                           hint=f"write it as a [{name}] section")
    return value


def _megabytes(section: dict, text_key: str, mb_key: str, default: int, folder: Path) -> int:
    if mb_key in section:
        return int(positive_number(section, mb_key, default, folder))
    value = section.get(text_key)
    if value is None:
        return default
    match = _SIZE.match(str(value))
    if not match:
        raise DatasetError(f"{folder / 'task.toml'}: {text_key} = {value!r} is not a size",
                           hint=f'write it like "512M" or "2G", or set {mb_key} = 512')
    number, unit = float(match.group(1)), match.group(2).upper()
    factor = {"": 1 / (1024 * 1024), "K": 1 / 1024, "M": 1, "G": 1024, "T": 1024 * 1024}[unit]
    return max(1, int(number * factor))


def _unsupported_environment(folder: Path, environment: dict) -> str:
    """Why this task cannot run in rlpipe's sandboxes as written ('' when it can)."""
    for name in ("docker-compose.yaml", "docker-compose.yml"):
        if (folder / "environment" / name).is_file():
            return (f"environment/{name}: a task of several containers (docker compose) is not run here; "
                    "one environment/Dockerfile is")
    if environment.get("allow_internet") is True:
        return "allow_internet = true: the sandboxes have no network"
    gpus = environment.get("gpus", 0)
    if isinstance(gpus, (int, float)) and not isinstance(gpus, bool) and gpus > 0:
        return f"gpus = {gpus}: the sandboxes have no GPU"
    return ""


