"""Which interpreter runs the engine worker: rollout.engine_python, else the controller's own,
except vllm without vllm importable here: the repository's .venv-vllm (make venv-vllm)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from rlpipe.core.config import load_config
from rlpipe.core.errors import ConfigError
from rlpipe.tasks.runtime import engine_python


def test_hf_runs_the_engine_worker_in_this_interpreter() -> None:
    assert engine_python(load_config(None)) == sys.executable


def test_a_given_interpreter_is_used_and_a_missing_one_refused(tmp_path: Path) -> None:
    python = tmp_path / "python"
    python.write_text("")
    assert engine_python(load_config(None, [f'rollout.engine_python="{python}"'])) == str(python)
    with pytest.raises(ConfigError, match="does not exist"):
        engine_python(load_config(None, [f'rollout.engine_python="{tmp_path / "nope"}"']))


def test_vllm_without_vllm_here_takes_the_vllm_venv_or_says_how_to_make_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("prefect")  # the controller's venv: vllm is not in it
    if __import__("importlib").util.find_spec("vllm") is not None:
        pytest.skip("vllm is importable here: the controller's interpreter serves")
    monkeypatch.chdir(tmp_path)
    config = load_config(None, ['rollout.engine="vllm"'])
    with pytest.raises(ConfigError, match="make venv-vllm"):
        engine_python(config)
    venv_python = tmp_path / ".venv-vllm" / "bin" / "python"
    venv_python.parent.mkdir(parents=True)
    venv_python.write_text("")
    assert engine_python(config) == str(venv_python)


def test_the_engine_interpreter_is_not_part_of_the_config_hash() -> None:
    assert load_config(None).config_hash() == load_config(None, ['rollout.engine_python="/x/python"']).config_hash()
