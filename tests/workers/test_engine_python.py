"""Which interpreter runs the engine worker: rollout.engine_python, else the controller's own,
except vllm without vllm importable here: the repository's .venv-vllm (make venv-vllm).

Interpreters are found from the repository (controller/runtime.py PROJECT_ROOT), never from the
current folder: a .venv-vllm/bin/python planted in the folder rlpipe starts from is neither
chosen nor run. What it does not: start a vLLM engine (tests/vllm, `make test-vllm`).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from rlpipe.controller import launch, preflight
from rlpipe.controller.preflight import engine_python
from rlpipe.core.config import load_config
from rlpipe.core.errors import ConfigError


def test_hf_runs_the_engine_worker_in_this_interpreter() -> None:
    assert engine_python(load_config(None)) == sys.executable


def test_a_given_interpreter_is_used_and_a_missing_one_refused(tmp_path: Path) -> None:
    python = tmp_path / "python"
    python.write_text("")
    assert engine_python(load_config(None, [f'rollout.engine_python="{python}"'])) == str(python)
    with pytest.raises(ConfigError, match="does not exist"):
        engine_python(load_config(None, [f'rollout.engine_python="{tmp_path / "nope"}"']))


@pytest.fixture
def planted_cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The current folder holds a .venv-vllm/bin/python that leaves a mark if it is ever run;
    the repository (PROJECT_ROOT) is a folder of its own, with no .venv-vllm yet."""
    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vllm is importable here: the controller's interpreter serves")
    elsewhere = tmp_path / "elsewhere"
    planted = elsewhere / ".venv-vllm" / "bin" / "python"
    planted.parent.mkdir(parents=True)
    planted.write_text(f"#!/bin/sh\ntouch {tmp_path / 'planted-python-ran'}\n")
    planted.chmod(0o755)
    monkeypatch.chdir(elsewhere)
    repository = tmp_path / "repository"
    repository.mkdir()
    monkeypatch.setattr(preflight, "PROJECT_ROOT", repository)
    monkeypatch.setattr(preflight, "VLLM_VENV_PYTHON", repository / ".venv-vllm" / "bin" / "python")
    return tmp_path


def _repository_python(planted_cwd: Path) -> Path:
    python = planted_cwd / "repository" / ".venv-vllm" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text("")
    return python


def test_vllm_takes_the_repositorys_venv_not_the_current_folders(planted_cwd: Path) -> None:
    config = load_config(None, ['rollout.engine="vllm"'])
    with pytest.raises(ConfigError, match="make venv-vllm"):  # the planted one does not count
        engine_python(config)
    python = _repository_python(planted_cwd)  # `make venv-vllm` in the repository
    assert engine_python(config) == str(python)


def test_a_relative_engine_python_is_taken_from_the_repository(planted_cwd: Path) -> None:
    config = load_config(None, ['rollout.engine_python=".venv-vllm/bin/python"'])
    with pytest.raises(ConfigError, match="does not exist"):  # though the current folder has one
        engine_python(config)
    python = _repository_python(planted_cwd)  # `make venv-vllm` in the repository
    assert engine_python(config) == str(python)


@pytest.mark.filterwarnings("ignore:The ``noload`` loader strategy:DeprecationWarning")  # MLflow's, as elsewhere
def test_a_vllm_run_started_from_the_planted_folder_never_runs_its_python(planted_cwd: Path) -> None:
    """build_runtime resolves the engine's interpreter before it starts a worker: refused here,
    and the planted interpreter has left no mark."""
    from tests.helpers.mlflow_db import seed_mlflow_db
    from tests.workers.workers_at_hand import tiny_config

    seed_mlflow_db(planted_cwd / "mlflow.db")
    with pytest.raises(ConfigError, match="make venv-vllm"):
        launch.build_runtime("planted-vllm", tiny_config(planted_cwd, 'rollout.engine="vllm"'))
    assert not (planted_cwd / "planted-python-ran").exists()


def test_the_engine_interpreter_is_not_part_of_the_config_hash() -> None:
    assert load_config(None).config_hash() == load_config(None, ['rollout.engine_python="/x/python"']).config_hash()
