"""The tests' CLI zygote (tests/helpers/cli_zygote.py) runs a command as a fresh interpreter
would: the same output and exit code, the request's environment where an import read it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from rlpipe.workers.zygote import import_settings
from tests.helpers import cli_zygote
from tests.helpers.cli_zygote import KEYED, PRELOAD, REREAD, run_rlpipe_command, zygote_environment

REPO_ROOT = Path(__file__).resolve().parents[2]
HARMLESS = {"PYTEST_CURRENT_TEST", "_RJEM_MALLOC_CONF"}
"""pytest's own; polars' allocator settings (read as polars loads, in C; nothing of the CLI
allocates through polars)."""

READS = textwrap.dedent("""
    import collections, importlib, json, os, sys
    present, reads = set(os.environ), collections.Counter()

    class Tracking(os._Environ):
        def __getitem__(self, key):
            reads[key] += 1
            return super().__getitem__(key)

    os.environ.__class__ = Tracking
    from tests.helpers.cli_zygote import PRELOAD
    for name in PRELOAD:
        importlib.import_module(name)
    # Code that iterates over the environment reads every variable, the probe too; a variable
    # read more often than the probe, or read while absent, was read by its name.
    iterations = reads["RLPIPE_CLI_ZYGOTE_PROBE"]
    print(json.dumps({"read": sorted(str(key) for key, count in reads.items()
                                     if count > iterations or (count and key not in present)),
                      "modules": sorted(name for name in sys.modules if name.startswith(("rlpipe.cli", "torch")))}))
""")


def test_the_run_scoped_variables_its_imports_read_are_read_again_or_keyed() -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "RLPIPE_CLI_ZYGOTE_PROBE": "1"}
    result = subprocess.run([sys.executable, "-c", READS], env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    seen = json.loads(result.stdout.splitlines()[-1])
    assert seen["modules"] == []  # the CLI's own modules and torch: as a fresh `rlpipe train` has them
    read_by_name = set(seen["read"])
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
