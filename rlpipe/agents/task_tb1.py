"""Terminal-Bench 1 task folders, mapped onto the same AgentTask as a Harbor task.

A Terminal-Bench 1 (TB1) folder:

    task.yaml            `instruction` (or `descriptions: [{key: base, description}]`),
                         max_agent_timeout_sec, max_test_timeout_sec, difficulty, category, tags
    Dockerfile           the task's image (build context: the folder, less the files below)
    docker-compose.yaml  one service (the client container): read only to refuse several
    solution.sh          the reference solution (solution.yaml, a list of keystrokes: no oracle)
    run-tests.sh         how the tests run (absent: `pytest $TEST_DIR/test_outputs.py -rA`)
    tests/               what run-tests.sh needs (test_outputs.py, ...)

The mapping: instruction from task.yaml; the Dockerfile and the other files as a Harbor
task's environment/ (its WORKDIR the work dir, /app when none); solution.sh as
solution/solve.sh; tests/ and run-tests.sh at /tests, with a test.sh written here that runs
`bash /tests/run-tests.sh` (TEST_DIR=/tests, cwd the work dir) and writes reward 1 when it
exits 0, else 0: TB1's pytest parser passes a task when every test passed, which is what
pytest's exit code says. TB1's harness supplied setup-uv-pytest.sh and run-uv-pytest.sh to
run-tests.sh: where tests/ lacks them, offline stand-ins are added (the first does nothing,
the second runs `uv run pytest $TEST_DIR/test_outputs.py -rA`: the tests runtime's pytest).

`load_tb1_task` raises DatasetError (a one-line reason and a hint) for a folder that is not
a TB1 task (no instruction, bad YAML, no tests), and returns a SkippedTask for one this
harness cannot run (several containers in docker-compose.yaml).

What it does not: run anything, or read the TB1 harness's other keys (parser_name other
than pytest, run_tests_in_same_shell, disable_asciinema: the trial runs tests its own way).
"""

from __future__ import annotations

from pathlib import Path

from rlpipe.agents.task_records import (
    DEFAULT_AGENT_TIMEOUT_S,
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
from rlpipe.core.errors import DatasetError
from rlpipe.sandbox.base import workspace_problem

NOT_CONTEXT = {"task.yaml", "solution.sh", "solution.yaml", "run-tests.sh", "docker-compose.yaml", "docker-compose.yml"}
DEFAULT_RUN_TESTS = "#!/bin/bash\npytest $TEST_DIR/test_outputs.py -rA\n"
TEST_SH = """#!/bin/bash
# written by rlpipe for a Terminal-Bench 1 task: run-tests.sh's exit code is the verdict.
# The tests run the agent's code: every process left behind is killed before the reward is
# written (kill -1 spares this script), and what that code left in /logs/verifier goes first.
export TEST_DIR=/tests
bash /tests/run-tests.sh
status=$?
while kill -9 -1 2>/dev/null; do :; done
chmod -R u+rwX /logs/verifier 2>/dev/null; rm -rf /logs/verifier/reward.txt /logs/verifier/reward.json
if [ "$status" -eq 0 ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
"""
HARNESS_SCRIPTS = {
    "setup-uv-pytest.sh": "# rlpipe: offline stand-in for Terminal-Bench's setup-uv-pytest.sh (the tests runtime has pytest)\n",
    "run-uv-pytest.sh": "#!/bin/bash\nuv run pytest $TEST_DIR/test_outputs.py -rA\n",
}


def load_tb1_task(folder: Path) -> AgentTask | SkippedTask:
    """One TB1 folder -> AgentTask, or SkippedTask with the reason; DatasetError if malformed."""
    config = _read_yaml(folder / "task.yaml")
    instruction = _instruction(config, folder)
    compose = folder / "docker-compose.yaml" if (folder / "docker-compose.yaml").is_file() else folder / "docker-compose.yml"
    if compose.is_file():
        services = (_read_yaml(compose).get("services") or {})
        if isinstance(services, dict) and len(services) > 1:
            return SkippedTask(folder.name, folder, f"{compose.name} has {len(services)} services ({', '.join(services)}): "
                                                    "a task of several containers is not run here")
    tests, _ = read_tree(folder / "tests")
    run_tests = folder / "run-tests.sh"
    if not tests and not run_tests.is_file():
        raise DatasetError(f"{folder} has neither tests/ nor run-tests.sh",
                           hint="a Terminal-Bench 1 task needs tests/test_outputs.py (and run-tests.sh to run it)")
    test_files = {**HARNESS_SCRIPTS, **tests}
    test_files = {name: data.encode() if isinstance(data, str) else data for name, data in test_files.items()}
    test_files["run-tests.sh"] = run_tests.read_bytes() if run_tests.is_file() else DEFAULT_RUN_TESTS.encode()
    test_files["test.sh"] = TEST_SH.encode()
    context, executable = _context(folder)
    solution = {"solve.sh": (folder / "solution.sh").read_bytes()} if (folder / "solution.sh").is_file() else {}
    total = sum(map(len, context.values())) + sum(map(len, test_files.values())) + sum(map(len, solution.values()))
    if total > MAX_TASK_BYTES:
        raise DatasetError(f"{folder} holds {total} bytes of files; at most {MAX_TASK_BYTES} are loaded",
                           hint="keep task folders small")
    dockerfile = context["Dockerfile"].decode("utf-8", errors="replace") if "Dockerfile" in context else None
    workdir = task_workdir({}, dockerfile, [instruction.encode(), *tests.values(), *solution.values()], folder)
    problem = workspace_problem(workdir)
    if problem:
        return SkippedTask(folder.name, folder, f"{problem} (the Dockerfile's WORKDIR)")
    limits = TaskLimits(agent_timeout_s=positive_number(config, "max_agent_timeout_sec", DEFAULT_AGENT_TIMEOUT_S, folder),
                        verifier_timeout_s=positive_number(config, "max_test_timeout_sec", DEFAULT_VERIFIER_TIMEOUT_S, folder))
    return AgentTask(
        task_id=folder.name, folder=folder, instruction=instruction, initial_files=context if dockerfile else {},
        executable_files=executable if dockerfile else (), setup_script=None, solution_files=solution,
        test_files=test_files, limits=limits, requires_commands=required_commands({}, test_files, solution, folder),
        category=str(config.get("category", "")), difficulty=str(config.get("difficulty", "")),
        tags=tuple(str(tag) for tag in config.get("tags", []) or []), workdir=workdir, dockerfile=dockerfile,
    )


def _read_yaml(path: Path) -> dict:
    import yaml

    try:
        loaded = yaml.safe_load(read_text(path))
    except yaml.YAMLError as exc:
        raise DatasetError(f"{path} is not valid YAML: {str(exc).splitlines()[0]}", hint="fix the YAML syntax") from exc
    if not isinstance(loaded, dict):
        raise DatasetError(f"{path} is not a mapping of keys", hint="a Terminal-Bench task.yaml maps keys (instruction: ...)")
    return loaded


def _instruction(config: dict, folder: Path) -> str:
    text = config.get("instruction")
    if text is None:
        for entry in config.get("descriptions") or []:
            if isinstance(entry, dict) and entry.get("key", "base") == "base":
                text = entry.get("description")
                break
    if not isinstance(text, str) or not text.strip():
        raise DatasetError(f"{folder / 'task.yaml'} has no instruction",
                           hint="set `instruction: |` (or descriptions: [{key: base, description: ...}])")
    return text.strip()


def _context(folder: Path) -> tuple[dict[str, bytes], tuple[str, ...]]:
    """The Dockerfile's build context: the folder's files less task.yaml, the solution, the tests."""
    files, executable = read_tree(folder)
    keep = {path: data for path, data in files.items() if path not in NOT_CONTEXT and not path.startswith("tests/")}
    return keep, tuple(path for path in executable if path in keep)
