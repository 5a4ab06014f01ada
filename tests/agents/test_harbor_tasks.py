"""Harbor tasks as published: environment/Dockerfile, files under /app, ENV, RUN, on both backends.

One task folder (written here, Harbor's layout): a Dockerfile `FROM local-base:1` with
WORKDIR /app, ENV, COPY and RUN; a solve.sh and a test.sh that use /app paths and the ENV
variable, and a test.sh as Harbor publishes it (`uvx ... pytest --ctrf ...`, served offline by
the tests runtime). On docker the Dockerfile is built (the base is rlpipe's own sandbox image tagged
`local-base:1` with USER root, as a published base would be: nothing is pulled); on
bubblewrap its steps are honoured on the host's /usr. The oracle passes and noop fails on
both, through run_trial; steps the sandbox cannot honour, and a base that is not present,
are skips that say why.
"""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest

from rlpipe.agents.agents import noop_agent, oracle_agent
from rlpipe.agents.records import TrialVerdict
from rlpipe.agents.task_format import AgentTask, load_task, load_tasks
from rlpipe.agents.trial import run_trial, system_prompt
from tests.sandbox._bwrap_support import require_bwrap
from tests.helpers.docker_engine import require_docker_engine

LOCAL_BASE = "local-base:1"
DOCKERFILE = f"""FROM {LOCAL_BASE}
WORKDIR /app
ENV GREETING=hello \\
    PLACE=world
COPY data.txt /app/
COPY scripts/ ./scripts/
RUN echo hi > /app/made.txt
EXPOSE 8080
CMD ["sh"]
"""
SOLVE = """#!/bin/bash
cd /app
sh scripts/total.sh data.txt > sum.txt
"""
TEST_SH = """#!/bin/bash
uvx -p 3.13 -w pytest==8.4.1 -w pytest-json-ctrf==0.3.5 pytest --ctrf /logs/verifier/ctrf.json /tests/test_outputs.py -rA
if [ $? -eq 0 ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
"""
TEST_OUTPUTS = """import os
from pathlib import Path


def test_cwd_is_app():
    assert os.getcwd() == "/app"


def test_env_lines():
    assert (os.environ["GREETING"], os.environ["PLACE"]) == ("hello", "world")


def test_run_made_its_file():
    assert Path("/app/made.txt").read_text().strip() == "hi"


def test_sum():
    assert Path("/app/sum.txt").read_text().strip() == "7"
"""


def harbor_task(root: Path, dockerfile: str = DOCKERFILE) -> Path:
    folder = root / "sum-in-app"
    files = {
        "task.toml": 'version = "1.0"\n[metadata]\ndifficulty = "easy"\n[verifier]\ntimeout_sec = 60.0\n'
                     '[agent]\ntimeout_sec = 120.0\n',
        "instruction.md": "Write the sum of the numbers in /app/data.txt to /app/sum.txt.\n",
        "environment/Dockerfile": dockerfile,
        "environment/data.txt": "3\n4\n",
        "environment/scripts/total.sh": "awk '{ s += $1 } END { print s }' \"$1\"\n",
        "solution/solve.sh": SOLVE,
        "tests/test.sh": TEST_SH,
        "tests/test_outputs.py": TEST_OUTPUTS,
    }
    for relative, text in files.items():
        path = folder / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    (folder / "environment/scripts/total.sh").chmod(0o755)
    return folder


def assert_only_the_sum_failed(detail: str) -> None:
    """pytest's -rA summary: the agent's file is missing; the work dir, ENV and RUN were right."""
    assert re.search(r"FAILED \S*::test_sum", detail), detail
    for name in ("test_cwd_is_app", "test_env_lines", "test_run_made_its_file"):
        assert re.search(rf"PASSED \S*::{name}", detail), detail


@pytest.fixture(scope="module")
def local_base():
    """rlpipe's sandbox image, as root, tagged local-base:1 (a locally present base image)."""
    require_docker_engine()
    from rlpipe.sandbox.docker_engine import docker_client
    from rlpipe.sandbox.image import ensure_image

    client = docker_client(None)
    dockerfile = f"FROM {ensure_image(client)}\nUSER root\n".encode()
    client.images.build(fileobj=io.BytesIO(dockerfile), tag=LOCAL_BASE, pull=False, network_mode="none", rm=True)
    return LOCAL_BASE


@pytest.mark.docker
def test_a_dockerfile_task_is_built_and_the_oracle_passes_noop_fails_on_docker(tmp_path, local_base):
    task = load_task(harbor_task(tmp_path))
    assert isinstance(task, AgentTask) and task.workdir == "/app"
    oracle = run_trial(task, "oracle", oracle_agent, "docker")
    assert (oracle.verdict, oracle.reward) == (TrialVerdict.PASSED, 1.0), oracle.detail
    noop = run_trial(task, "noop", noop_agent, "docker")
    assert (noop.verdict, noop.reward) == (TrialVerdict.FAILED, 0.0), noop.detail
    assert_only_the_sum_failed(noop.detail)


@pytest.mark.docker
def test_a_base_image_that_is_not_here_is_a_skip_naming_it(tmp_path, local_base):
    task = load_task(harbor_task(tmp_path, DOCKERFILE.replace(LOCAL_BASE, "registry.invalid/nowhere:9")))
    skipped = run_trial(task, "oracle", oracle_agent, "docker")
    assert skipped.verdict is TrialVerdict.SKIPPED
    assert "registry.invalid/nowhere:9" in skipped.detail and "cannot be pulled" in skipped.detail


def test_a_dockerfile_task_runs_on_bubblewrap_with_from_ignored(tmp_path):
    require_bwrap()
    task = load_task(harbor_task(tmp_path))
    oracle = run_trial(task, "oracle", oracle_agent, "bwrap")
    assert (oracle.verdict, oracle.reward) == (TrialVerdict.PASSED, 1.0), oracle.detail
    assert f"FROM {LOCAL_BASE} ignored" in oracle.detail
    noop = run_trial(task, "noop", noop_agent, "bwrap")
    assert (noop.verdict, noop.reward) == (TrialVerdict.FAILED, 0.0), noop.detail
    assert_only_the_sum_failed(noop.detail)


@pytest.mark.parametrize(("line", "reason"), [
    ("USER nobody", "USER is not honoured"),
    ("RUN apt-get install -y jq", "`apt-get` installs or downloads"),
    ("COPY data.txt /usr/local/share/", "outside the work dir /app"),
    ("ADD https://example.com/x.tar.gz /app/", "ADD of a URL"),
    ("FROM scratch AS second", "multi-stage"),
    ("ONBUILD RUN true", "ONBUILD is not honoured"),
])
def test_a_step_bubblewrap_cannot_honour_is_a_skip_naming_it(tmp_path, line, reason):
    require_bwrap()
    task = load_task(harbor_task(tmp_path, DOCKERFILE + line + "\n"))
    skipped = run_trial(task, "oracle", oracle_agent, "bwrap")
    assert skipped.verdict is TrialVerdict.SKIPPED and reason in skipped.detail, skipped.detail
    assert "environment/Dockerfile line" in skipped.detail


def test_the_system_prompt_names_the_task_work_dir():
    assert "working directory is /app" in system_prompt("/app") and "/work" not in system_prompt("/app")
    assert "working directory is /work" in system_prompt()


TB1_FILES = {
    "task.yaml": "instruction: |\n  Write the sum of the numbers in /app/data.txt to /app/sum.txt.\n"
                 "difficulty: easy\ncategory: file-operations\ntags: [sum]\nparser_name: pytest\n"
                 "max_agent_timeout_sec: 120\nmax_test_timeout_sec: 60\n",
    "Dockerfile": f"FROM {LOCAL_BASE}\nWORKDIR /app\nCOPY data.txt /app/\n",
    "docker-compose.yaml": "services:\n  client:\n    build: .\n",
    "data.txt": "3\n4\n",
    "solution.sh": "#!/bin/bash\nawk '{ s += $1 } END { print s }' /app/data.txt > /app/sum.txt\n",
    "run-tests.sh": "#!/bin/bash\nsource $TEST_DIR/setup-uv-pytest.sh\nbash $TEST_DIR/run-uv-pytest.sh\n",
    "tests/test_outputs.py": "from pathlib import Path\n\n\ndef test_sum():\n"
                             "    assert Path('/app/sum.txt').read_text().strip() == '7'\n",
}


def write_folder(folder: Path, files: dict[str, str]) -> Path:
    for relative, text in files.items():
        (folder / relative).parent.mkdir(parents=True, exist_ok=True)
        (folder / relative).write_text(text)
    return folder


def test_a_terminal_bench_1_folder_loads_and_the_oracle_passes_noop_fails_on_bubblewrap(tmp_path):
    require_bwrap()
    task = load_task(write_folder(tmp_path / "tb1-sum", TB1_FILES))
    assert isinstance(task, AgentTask) and task.workdir == "/app" and task.instruction.startswith("Write the sum")
    assert (task.limits.agent_timeout_s, task.limits.verifier_timeout_s, task.difficulty) == (120, 60, "easy")
    assert set(task.initial_files) == {"Dockerfile", "data.txt"} and "run-tests.sh" in task.test_files
    oracle = run_trial(task, "oracle", oracle_agent, "bwrap")
    assert (oracle.verdict, oracle.reward) == (TrialVerdict.PASSED, 1.0), oracle.detail
    noop = run_trial(task, "noop", noop_agent, "bwrap")
    assert (noop.verdict, noop.reward) == (TrialVerdict.FAILED, 0.0), noop.detail
    assert re.search(r"FAILED \S*::test_sum", noop.detail), noop.detail


@pytest.mark.docker
def test_a_terminal_bench_1_folder_runs_on_docker(tmp_path, local_base):
    task = load_task(write_folder(tmp_path / "tb1-sum", TB1_FILES))
    oracle = run_trial(task, "oracle", oracle_agent, "docker")
    assert (oracle.verdict, oracle.reward) == (TrialVerdict.PASSED, 1.0), oracle.detail
    noop = run_trial(task, "noop", noop_agent, "docker")
    assert (noop.verdict, noop.reward) == (TrialVerdict.FAILED, 0.0), noop.detail


def test_every_folder_is_loaded_or_reported_one_line_each(tmp_path):
    harbor_task(tmp_path)
    write_folder(tmp_path / "tb1-sum", TB1_FILES)
    write_folder(tmp_path / "tb1-two-containers", {**TB1_FILES, "docker-compose.yaml":
                                                   "services:\n  client: {build: .}\n  db: {image: postgres}\n"})
    write_folder(tmp_path / "tb1-no-instruction", {**TB1_FILES, "task.yaml": "difficulty: easy\n"})
    write_folder(tmp_path / "notes", {"README.md": "not a task\n"})
    loaded = {task.task_id: task for task in load_tasks(tmp_path)}
    assert sorted(loaded) == ["notes", "sum-in-app", "tb1-no-instruction", "tb1-sum", "tb1-two-containers"]
    assert isinstance(loaded["sum-in-app"], AgentTask) and isinstance(loaded["tb1-sum"], AgentTask)
    assert loaded["tb1-two-containers"].reason.startswith("docker-compose.yaml has 2 services")
    assert loaded["tb1-no-instruction"].invalid and "has no instruction" in loaded["tb1-no-instruction"].reason
    assert loaded["notes"].invalid and "neither a Harbor task" in loaded["notes"].reason
    for skipped in (loaded["tb1-two-containers"], loaded["tb1-no-instruction"], loaded["notes"]):
        assert "\n" not in skipped.reason
