"""Bad input to `rlpipe train` gives a short error naming the field or value and the fix,
exit code 2, no traceback, and nothing written to the lake. Runs the real command."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.ports import free_port
from tests.helpers.cli_zygote import run_rlpipe_command

RLPIPE = [sys.executable, "-m", "rlpipe.cli.main"]


def run_cli(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    # a narrow console: a message that wrapped would break the words the tests look for
    env = dict(os.environ, PREFECT_LOGGING_LEVEL="WARNING", RLPIPE_HOME=str(cwd / "home"), COLUMNS="40")
    return run_rlpipe_command(args, env, cwd, 180)


def lake_files(lake: Path) -> list[Path]:
    return [path for path in lake.rglob("*") if path.is_file()] if lake.exists() else []


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


CASES = {
    "misspelt key": ("[rollout]\ngroup_sise = 4\n", [], ["rollout.group_sise", "group_size"]),
    "negative group size": ("[rollout]\ngroup_size = -2\n", [], ["rollout.group_size", "greater than 0"]),
    "misspelt section": ("[rolout]\ngroup_size = 4\n", [], ["rolout", "rollout"]),
    "bad override": ("", ["--set", "train.steps=many"], ["train.steps", "many"]),
    "missing model folder": ("[model]\npath = \"/nonexistent/model\"\n", [], ["/nonexistent/model"]),
    "unknown domain": ("[envs]\ndomains = {arithmetc = 1.0}\n", [], ["arithmetc", "arithmetic"]),
    "missing engine interpreter": ("[rollout]\nengine = \"vllm\"\nengine_python = \"/nonexistent/python\"\n", [],
                                   ["rollout.engine_python", "/nonexistent/python"]),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_config_exits_2_without_traceback_and_writes_nothing(tmp_path: Path, case: str) -> None:
    toml, extra, must_mention = CASES[case]
    lake = tmp_path / "lake"
    config = write(tmp_path / "bad.toml", toml + f'\n[storage]\nlake_uri = "{lake}"\n' if "[storage]" not in toml else toml)
    result = run_cli(["train", str(config), *extra], tmp_path)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    for word in must_mention:
        assert word in result.stderr, (word, result.stderr)
    assert "hint" in result.stderr
    assert lake_files(lake) == [] and not lake.exists()  # refused before the lake (or a flow run) was made


def test_unreachable_s3_endpoint_exits_2_quickly(tmp_path: Path) -> None:
    port = free_port()  # nothing listens there
    config = write(
        tmp_path / "s3.toml",
        f'[storage]\nlake_uri = "s3://rlpipe/lake"\ns3_endpoint_url = "http://127.0.0.1:{port}"\n'
        's3_access_key = "k"\ns3_secret_key = "s"\n',
    )
    result = run_cli(["train", str(config)], tmp_path)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    assert f"127.0.0.1:{port}" in result.stderr
    assert "hint" in result.stderr


def test_missing_config_file_exits_2(tmp_path: Path) -> None:
    result = run_cli(["train", str(tmp_path / "nope.toml")], tmp_path)
    assert result.returncode == 2
    assert "nope.toml" in result.stderr and "Traceback" not in result.stderr
