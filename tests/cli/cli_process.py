"""Run the real `rlpipe` command in a subprocess for CLI tests, on a narrow console (COLUMNS=40)
so that any message Rich would wrap at the width shows up broken in the output."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from tests.helpers.cli_zygote import run_rlpipe_command

RLPIPE = [sys.executable, "-m", "rlpipe.cli.main"]
REPO_ROOT = Path(__file__).resolve().parents[2]
NARROW = "40"


def run_rlpipe(args: list[str], cwd: Path, timeout_s: float = 300, **env: str) -> subprocess.CompletedProcess[str]:
    environment = dict(os.environ, COLUMNS=NARROW, PREFECT_LOGGING_LEVEL="WARNING", RLPIPE_HOME=str(cwd / "rlpipe-home"),
                       PYTHONPATH=str(REPO_ROOT), NO_PROXY="127.0.0.1,localhost", no_proxy="127.0.0.1,localhost")
    environment.update(env)
    return run_rlpipe_command(args, environment, cwd, timeout_s)


def error_lines(result: subprocess.CompletedProcess[str]) -> tuple[str, str]:
    """The `error:` and `hint:` lines of a failed command (each must be one whole line)."""
    lines = result.stderr.splitlines()
    error = [line for line in lines if line.startswith("error: ")]
    hint = [line for line in lines if line.startswith("hint: ")]
    assert len(error) == 1 and len(hint) == 1, result.stderr
    return error[0], hint[0]
