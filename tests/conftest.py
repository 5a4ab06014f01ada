"""Session fixtures shared by test folders, and the settings every test process runs with.

- ONE Prefect test harness (a temporary API server and database) for the whole session. Two
  nested harnesses in one session split a flow's records between them (flow runs reach the
  newer server, task runs may reach the older), so every folder that needs Prefect requests
  `prefect_api_url` instead of starting its own. It starts on a copy of the test run's ready
  database (migrated, nothing run yet; made once for all pytest-xdist workers by the first
  that needs Prefect), which is also `prefect_db_snapshot`: tests that start a temporary
  server of their own seed its PREFECT_HOME with it (tests/helpers/prefect_db.py) instead
  of paying 8-13 s of CPU to migrate a new database.
- ONE moto S3 server (its own process, real HTTP on 127.0.0.1) for the whole session:
  `s3_endpoint`. Tests stay independent by each using buckets of its own
  (tests.helpers.s3_server.unique_bucket), never by starting a server.
- Stage retries back off from $RLPIPE_RETRY_BACKOFF_S (rlpipe/orchestration/stage_options.py); the
  tests set it to 0.1 s (0.1, 0.2, ... 3.2 s instead of 1, 2, ... 32 s) unless the
  environment already sets it, so a retried stage costs the suite little. It is set here,
  before any test module imports rlpipe.tasks, and CLI subprocesses inherit it.
- Longest files first: `make test` runs four pytest-xdist workers, one file at a time each, in
  collection order (--no-loadscope-reorder); the files in LONGEST_FILES start first, so the
  long poles overlap the many short files instead of running alone at the end.
- ONE shared zygote per pytest process (workers/launch.py: `start_shared_zygote`), whose
  socket path is exported as RLPIPE_ZYGOTE_SOCKET before the first test: every controller
  of the session, in this process or a CLI subprocess, forks its workers from it where its
  import settings fit (the same thread counts, PYTHONPATH and so on), instead of each run's
  own zygote importing torch and transformers again (~5 s of CPU a run). PYTHONPATH (the
  repository, what every CLI run of the tests gets) and HF_HUB_DISABLE_PROGRESS_BARS=1 (what
  `rlpipe` sets for its workers) are set here, so that CLI runs and this process's own
  controllers import under the same settings; a test that leaves one of the compared
  variables changed fails at its teardown, naming them, and they are put back
  (`_environment_kept_for_the_shared_zygote`), so one leak cannot cost every later run of the
  process a zygote of its own. A test that finds its processes by a marker in their
  environment (tests/helpers/processes.py) either keeps its runs off it (`own_zygote_env`) or
  counts the zygote's new workers beside the marked processes (`shared_zygote_workers`): a
  forked worker's /proc/PID/environ is the zygote's. Tests of the launch paths themselves
  unset it.
- The CLI tests' `rlpipe` commands (tests/durability/cli_runs.py `run_cli`, tests/cli/cli_process.py
  `run_rlpipe`) fork from a CLI zygote of this process that imported Prefect, MLflow and the
  controller once (tests/helpers/cli_zygote.py), instead of ~4.5 s of imports a command;
  RLPIPE_TEST_CLI_ZYGOTE=0 runs each in a fresh interpreter.
- One torch thread per process (OMP_NUM_THREADS=1, MKL_NUM_THREADS=1, unless the environment
  sets them): the suite runs four pytest workers, each starting CLI runs and their worker
  processes, on two cores; a second OpenMP thread per process only spins and waits there.
  Tests that need a thread count of their own set it (tests/rl/conftest.py).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from torch._inductor.runtime import cache_dir_utils

from rlpipe.workers.launch import LAUNCH_ENV_VAR, SHARED_ZYGOTE_ENV_VAR, start_shared_zygote
from rlpipe.workers.zygote import import_settings
from tests.helpers.prefect_db import ready_harness
from tests.helpers.s3_server import start_moto_server

# The files that took longest in CI, longest first: seconds (setup + call + teardown summed
# per file) in a fresh-clone `.ci/run`, from the summary this file prints at the end of a run
# (the order matters, not the figures). Started first, they leave the short files to fill
# the end of both workers' time. What each file and test costs in CPU, its processes
# included (on two cores the suite is CPU-bound, so CPU is what CI's minutes are):
# `python -m pytest -p scripts.cpu_by_test ...`, then `python scripts/cpu_by_test.py`.
LONGEST_FILES = (  # seconds of a quiet fresh-clone `.ci/run` (docs/RESULTS.md, "The test suite's time")
    "tests/cli/test_up_serves_train.py",  # 213
    "tests/cli/test_signals.py",  # 136
    "tests/durability/test_kill_resume.py",  # 126
    "tests/workers/test_trainer_group.py",  # 107
    "tests/flows/test_learning_e2e.py",  # 104
    "tests/agents/test_verifier_trust.py",  # 94
    "tests/agents/test_eval_hostile_cli.py",  # 93
    "tests/flows/test_ui_retry.py",  # 90
    "tests/sandbox/test_docker_warm_python.py",  # 67
    "tests/qa/test_qa_suite.py",  # 62
    "tests/durability/test_s3_outage.py",  # 59
    "tests/qa/test_qa_agent_tasks.py",  # 55
    "tests/agents/test_eval_resume.py",  # 49
    "tests/rl/test_gguf_folder.py",  # 49
    "tests/durability/test_checkpoint_background.py",  # < 30 (started early, it used to end late)
    "tests/durability/test_part_write_enospc.py",  # < 30
    "tests/cli/test_resume_more_steps.py",  # < 30
    "tests/durability/test_async_kill_resume.py",  # < 30
    "tests/agents/test_eval_cli.py",  # < 30
    "tests/flows/test_learning_torchrun.py",  # `extended`: only in make test-extended
    "tests/flows/test_agent_rl_flow.py",  # a warm start and 2 steps of agent episodes: slow under load
)

TEST_RETRY_BACKOFF_S = "0.1"
os.environ.setdefault("RLPIPE_RETRY_BACKOFF_S", TEST_RETRY_BACKOFF_S)
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")
os.environ.setdefault("PYTHONPATH", str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # what `rlpipe` sets for its workers (cli/main.py)
# torch's inductor writes TORCHINDUCTOR_CACHE_DIR into os.environ the first time anything asks
# for its cache folder (collecting the whole suite does; MLflow's model logging does), so a file
# run alone saw it "changed" by its own test: set it once, here, to the folder torch picks.
cache_dir_utils.cache_dir()


@pytest.fixture(scope="session", autouse=True)
def _shared_zygote() -> Iterator[dict[str, str] | None]:
    """Start this process's shared zygote and export its socket (module docstring); none
    where the environment names one already or asks for spawned workers. Yields the import
    settings it was started under (None: no zygote of this session)."""
    if os.environ.get(SHARED_ZYGOTE_ENV_VAR) or os.environ.get(LAUNCH_ENV_VAR, "").strip().lower() == "spawn":
        yield None
        return
    folder = tempfile.mkdtemp(prefix="rlz-")  # short: an AF_UNIX path stops at 107 bytes
    settings = import_settings(dict(os.environ))  # what the zygote's hello will say
    zygote = start_shared_zygote(os.path.join(folder, "zygote.sock"))
    os.environ[SHARED_ZYGOTE_ENV_VAR] = os.path.join(folder, "zygote.sock")
    try:
        yield settings
    finally:
        os.environ.pop(SHARED_ZYGOTE_ENV_VAR, None)
        zygote.terminate()
        try:
            zygote.wait(timeout=10)
        except subprocess.TimeoutExpired:
            zygote.kill()
            zygote.wait()
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(autouse=True)
def _environment_kept_for_the_shared_zygote(_shared_zygote: dict[str, str] | None) -> Iterator[None]:
    """Fail a test that leaves this process's environment other than the shared zygote's
    import settings (module docstring), and put those variables back: otherwise every later
    controller of the process, in-process or a CLI run, would find the zygote's settings
    different and start a zygote of its own (torch and transformers imported again)."""
    yield
    if _shared_zygote is None:
        return
    now = import_settings(dict(os.environ))
    changed = sorted(name for name in now.keys() | _shared_zygote.keys() if now.get(name) != _shared_zygote.get(name))
    if not changed:
        return
    for name in changed:
        if name in _shared_zygote:
            os.environ[name] = _shared_zygote[name]
        else:
            os.environ.pop(name, None)
    pytest.fail(f"the test left the environment changed in {', '.join(changed)}, which the session's shared zygote "
                "compares: set variables with monkeypatch.setenv/delenv (undone after the test), or pass an env "
                "to the subprocess", pytrace=False)


@pytest.fixture(scope="session")
def _prefect_harness(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path | None]]:
    """Start the session's Prefect harness on first use, on the test run's ready database
    (tests/helpers/prefect_db.py): its API URL and that database."""
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base  # the workers' common folder
    with ready_harness(shared) as (api_url, ready_database):
        yield api_url, ready_database


@pytest.fixture(scope="session")
def prefect_api_url(_prefect_harness: tuple[str, Path | None]) -> str:
    """The session's Prefect API URL (for subprocesses)."""
    return _prefect_harness[0]


@pytest.fixture(scope="session")
def prefect_db_snapshot(_prefect_harness: tuple[str, Path | None]) -> Path | None:
    """A ready, unused Prefect database file (tests/helpers/prefect_db.py), or None."""
    return _prefect_harness[1]


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """The session's moto S3 server, started on first use: its endpoint URL."""
    endpoint_url, stop = start_moto_server()
    try:
        yield endpoint_url
    finally:
        stop()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Move the files of LONGEST_FILES to the front, in that order; the rest keep theirs."""
    rank = {path: index for index, path in enumerate(LONGEST_FILES)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))



_FILE_SECONDS: dict[str, float] = {}  # per test file: setup + call + teardown, summed over its tests
SLOWEST_FILES_SHOWN = 20


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Add each phase's duration to its file (under xdist the controller sees every worker's
    reports, so the sums cover the whole run)."""
    path = report.nodeid.split("::", 1)[0]
    _FILE_SECONDS[path] = _FILE_SECONDS.get(path, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:  # noqa: ARG001
    """The slowest files of this run, in seconds: the measured budget that LONGEST_FILES's
    order is taken from (update it from a fresh-clone `.ci/run`)."""
    if not _FILE_SECONDS:
        return
    terminalreporter.write_sep("=", f"slowest {SLOWEST_FILES_SHOWN} files (seconds, setup + call + teardown)")
    for path, seconds in sorted(_FILE_SECONDS.items(), key=lambda item: -item[1])[:SLOWEST_FILES_SHOWN]:
        listed = " (in LONGEST_FILES)" if path in LONGEST_FILES else ""
        terminalreporter.write_line(f"{seconds:8.1f}  {path}{listed}")
