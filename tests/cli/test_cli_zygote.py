"""The tests' CLI zygote (tests/helpers/cli_zygote.py) runs a command as a fresh interpreter
would: the same output and exit code, the request's environment where an import read it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from rlpipe.workers.zygote import import_settings
from tests.helpers import cli_zygote
from tests.helpers.cli_zygote import KEYED, PRELOAD, REREAD, run_rlpipe_command, zygote_environment
from tests.helpers.import_reads import read_at_import

REPO_ROOT = Path(__file__).resolve().parents[2]
HARMLESS = {"PYTEST_CURRENT_TEST", "_RJEM_MALLOC_CONF"}
"""pytest's own; polars' allocator settings (read as polars loads, in C; nothing of the CLI
allocates through polars)."""


def test_the_run_scoped_variables_its_imports_read_are_read_again_or_keyed() -> None:
    read_by_name, modules = read_at_import("tests.helpers.cli_zygote")
    assert {name for name in modules if name.startswith(("rlpipe.cli", "torch"))} == set()  # as a fresh `rlpipe train`
    assert {"PREFECT_HOME", "MLFLOW_LOGGING_LEVEL"} <= read_by_name  # it sees reads that matter
    unkeyed = {key for key in read_by_name if not import_settings({key: ""}) and key not in KEYED}
    assert {key for key in unkeyed if not key.startswith(REREAD)} <= HARMLESS
    assert "rlpipe.cli.main" not in PRELOAD


@pytest.mark.parametrize("args", [["--help"], ["runs", "list", "--lake", "missing-lake"], ["train", "missing.toml"]])
def test_a_forked_command_prints_what_a_fresh_interpreter_prints(tmp_path: Path, args: list[str]) -> None:
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT), COLUMNS="40", RLPIPE_HOME=str(tmp_path / "home"))
    forked = run_rlpipe_command(args, env, tmp_path, 300)
    fresh = subprocess.run([sys.executable, "-m", "rlpipe.cli.main", *args], env=env, cwd=tmp_path,
                           capture_output=True, text=True, timeout=300)
    assert (forked.returncode, forked.stdout, forked.stderr) == (fresh.returncode, fresh.stdout, fresh.stderr)


def test_a_request_that_differs_in_a_keyed_variable_gets_a_zygote_of_its_own() -> None:
    env = dict(os.environ)
    assert zygote_environment(env) != zygote_environment(dict(env, RLPIPE_RETRY_BACKOFF_S="7"))
    assert zygote_environment(env) == zygote_environment(dict(env, PREFECT_HOME="/elsewhere", COLUMNS="33"))


def test_a_command_after_its_zygote_died_gets_a_fresh_zygote(tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT), RLPIPE_HOME=str(tmp_path / "home"))
    args = ["runs", "list", "--lake", "missing-lake"]
    first = run_rlpipe_command(args, env, tmp_path, 300)
    zygote = cli_zygote._zygote_for(env)
    zygote.process.kill()
    zygote.process.wait()
    again = run_rlpipe_command(args, env, tmp_path, 300)
    assert (again.returncode, again.stderr) == (first.returncode, first.stderr) and first.returncode == 2
    assert cli_zygote._zygote_for(env).process.pid != zygote.process.pid
