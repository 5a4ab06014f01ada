"""cluster.engine_on_ray without Ray: the combinations no run can serve fail in preflight, before
the lake is made, and the knob stays out of the config hash.

The actor itself is tested in tests/ray/test_ray_engine.py (`make test-ray`, its own venv).
"""

from __future__ import annotations

import importlib.util

import pytest

from rlpipe.controller.preflight import preflight
from rlpipe.core.config import load_config
from rlpipe.core.errors import ConfigError

ON_RAY = ['cluster.ray_address="127.0.0.1:6379"', "cluster.engine_on_ray=true"]


def test_engine_on_ray_needs_a_ray_address(tmp_path):
    lake = tmp_path / "lake"
    config = load_config(None, ["cluster.engine_on_ray=true", f'storage.lake_uri="{lake}"'])
    with pytest.raises(ConfigError, match="needs cluster.ray_address"):
        preflight(config)
    assert not lake.exists()


def test_engine_on_ray_refuses_another_engine_interpreter(tmp_path):
    config = load_config(None, ON_RAY + ['rollout.engine_python="/usr/bin/python3"', f'storage.lake_uri="{tmp_path / "lake"}"'])
    with pytest.raises(ConfigError, match="engine_python"):
        preflight(config)


@pytest.mark.skipif(importlib.util.find_spec("ray") is not None, reason="ray is installed here (tests/ray covers it)")
def test_engine_on_ray_without_ray_is_a_config_error_with_the_install_hint(tmp_path):
    lake = tmp_path / "lake"
    config = load_config(None, ON_RAY + [f'storage.lake_uri="{lake}"'])  # the default domains run no code
    with pytest.raises(ConfigError, match="ray is not installed") as raised:
        preflight(config)
    assert "make venv-ray" in raised.value.hint
    assert not lake.exists()


def test_engine_on_ray_is_left_out_of_the_config_hash():
    local = load_config(None, [])
    on_ray = load_config(None, ON_RAY + ["cluster.ray_engine_cpus=2", "cluster.ray_engine_gpus=1"])
    assert on_ray.config_hash() == local.config_hash()
