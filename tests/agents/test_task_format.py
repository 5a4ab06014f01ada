"""The Harbor task loader: a good folder, and each kind of bad or unsupported folder."""

from __future__ import annotations

import shutil

import pytest

from rlpipe.agents.task_format import AgentTask, SkippedTask, builtin_suite_dir, load_task, load_tasks
from rlpipe.core.errors import DatasetError
from tests.agents.helpers import copy_task


def test_a_builtin_task_loads_with_its_limits_files_and_requirements():
    task = load_task(builtin_suite_dir() / "git-find-author")
    assert isinstance(task, AgentTask)
    assert task.instruction.startswith("In the git repository")
    assert task.limits.agent_timeout_s == 120.0 and task.limits.verifier_timeout_s == 30.0
    assert task.limits.max_steps == 20 and task.limits.memory_mb == 512 and task.limits.storage_mb == 64
    assert task.setup_script == "setup.sh" and "setup.sh" in task.initial_files
    assert set(task.test_files) == {"test.sh", "check.py"} and set(task.solution_files) == {"solve.sh"}
    # declared (git, printf, head) + sh always + bash from solve.sh's #! line
    assert task.requires_commands == ("bash", "git", "head", "printf", "sh")
    assert task.category == "git"


def test_the_builtin_suite_has_at_least_twenty_tasks_across_kinds():
    tasks = load_tasks(builtin_suite_dir())
    assert len(tasks) >= 20 and all(isinstance(task, AgentTask) for task in tasks)
    kinds = {task.category for task in tasks}
    assert kinds == {"fix-failing-test", "finish-a-build", "data-wrangling", "repair-config", "git",
                     "find-facts-in-logs", "multi-file-edit"}


def test_harbor_size_strings_and_missing_toml_use_defaults(tmp_path):
    folder = copy_task(tmp_path, toml='[environment]\nmemory = "2G"\nstorage = "512M"\n')
    task = load_task(folder)
    assert (task.limits.memory_mb, task.limits.storage_mb) == (2048, 512)  # 2 * 1024; 512
    (folder / "task.toml").unlink()
    assert load_task(folder).limits.max_steps == 50  # DEFAULT_MAX_STEPS


@pytest.mark.parametrize(("toml", "files", "message"), [
    (None, {"instruction.md": ""}, "instruction.md is missing"),
    (None, {"tests__test.sh": ""}, "tests/test.sh is missing"),
    ("[agent\ntimeout_sec = 1", {}, "is not valid TOML"),
    ("[agent]\ntimeout_sec = \"soon\"\n", {}, "timeout_sec = 'soon' must be a positive number"),
    ("[agent]\nmax_steps = -3\n", {}, "max_steps = -3 must be a positive number"),
    ("[environment]\nmemory = \"lots\"\n", {}, "memory = 'lots' is not a size"),
    ("[environment]\nrequires_commands = \"git\"\n", {}, "must be a list of command names"),
    ("[environment]\nsetup_script = \"nope.sh\"\n", {}, "is not a file in environment/"),
    ("agent = 3\n", {}, "agent must be a table"),
])
def test_a_malformed_folder_is_a_dataset_error_naming_the_problem(tmp_path, toml, files, message):
    folder = copy_task(tmp_path, toml=toml, **files)
    with pytest.raises(DatasetError, match=message.replace("(", r"\(").replace("[", r"\[")):
        load_task(folder)


@pytest.mark.parametrize(("toml", "files", "reason"), [
    (None, {"environment__docker-compose.yaml": "services: {}\n"}, "several containers"),
    ("[environment]\nworkdir = \"/usr/src/app\"\n", {}, "inside a system folder"),
    ("[environment]\nallow_internet = true\n", {}, "no network"),
    ("[environment]\ngpus = 1\n", {}, "no GPU"),
])
def test_an_environment_the_sandbox_cannot_give_is_skipped_with_the_reason(tmp_path, toml, files, reason):
    loaded = load_task(copy_task(tmp_path, toml=toml, **files))
    assert isinstance(loaded, SkippedTask) and not loaded.invalid and reason in loaded.reason


def test_one_bad_folder_among_many_is_recorded_invalid_and_the_rest_load(tmp_path):
    copy_task(tmp_path)
    copy_task(tmp_path, name="order-totals", **{"tests__test.sh": ""})
    loaded = {task.task_id: task for task in load_tasks(tmp_path)}
    assert isinstance(loaded["fix-median-bug"], AgentTask)
    assert isinstance(loaded["order-totals"], SkippedTask) and loaded["order-totals"].invalid


def test_a_missing_or_empty_task_folder_is_a_dataset_error(tmp_path):
    with pytest.raises(DatasetError, match="does not exist"):
        load_tasks(tmp_path / "absent")
    with pytest.raises(DatasetError, match="holds no task folder"):
        load_tasks(tmp_path)


def test_a_dockerfile_task_loads_with_its_workdir_and_its_context(tmp_path):
    """A Dockerfile no longer skips a task at load time: the backend decides (agents/task_env.py)."""
    task = load_task(copy_task(tmp_path / "a", **{"environment__Dockerfile": "FROM ubuntu:24.04\nWORKDIR /srv\nWORKDIR app\n"}))
    assert isinstance(task, AgentTask)
    assert task.workdir == "/srv/app" and task.dockerfile.startswith("FROM ubuntu") and "Dockerfile" in task.initial_files
    assert load_task(copy_task(tmp_path / "b", **{"instruction.md": "Fix the script in /app/run.sh.\n"})).workdir == "/app"
    assert load_task(copy_task(tmp_path / "c")).workdir == "/work"


def test_bytecode_caches_in_a_task_folder_are_not_part_of_the_task(tmp_path):
    """A task whose check.py was run where it lies (a __pycache__ beside it) is the same task."""
    clean = load_task(builtin_suite_dir() / "fix-median-bug")
    folder = tmp_path / "fix-median-bug"
    shutil.copytree(builtin_suite_dir() / "fix-median-bug", folder)
    for part in ("tests", "environment", "solution"):
        cache = folder / part / "__pycache__"
        cache.mkdir(parents=True, exist_ok=True)
        (cache / "check.cpython-311.pyc").write_bytes(b"\x00stale bytecode")
    task = load_task(folder)
    assert isinstance(task, AgentTask)
    assert (task.test_files, task.initial_files, task.solution_files) == (clean.test_files, clean.initial_files,
                                                                          clean.solution_files)
