"""The [cluster] table without Ray: a clear ConfigError when ray is missing, the hash unmoved.

Ray itself is tested in tests/ray (`make test-ray`, its own venv): the main venv has no ray,
so here cluster.ray_address set must fail before any sandbox or flow run, saying how to
install it. Where ray is installed (the .venv-ray), the first test is skipped.
"""

from __future__ import annotations

import importlib.util

import pytest

from rlpipe.controller.launch import build_sandbox_pool
from rlpipe.controller.preflight import preflight
from rlpipe.controller.sample import build_mixture
from rlpipe.core.config import load_config
from rlpipe.core.errors import ConfigError

CODE_ON_RAY = ["envs.domains={code = 1.0}", 'cluster.ray_address="127.0.0.1:6379"', "sandbox.pool_size=1"]


@pytest.mark.skipif(importlib.util.find_spec("ray") is not None, reason="ray is installed here (tests/ray covers it)")
def test_ray_address_without_ray_is_a_config_error_with_the_install_hint():
    config = load_config(None, CODE_ON_RAY)
    with pytest.raises(ConfigError) as raised:
        build_sandbox_pool(config, build_mixture(config))
    assert "ray is not installed" in raised.value.message
    assert "make venv-ray" in raised.value.hint


@pytest.mark.skipif(importlib.util.find_spec("ray") is not None, reason="ray is installed here (tests/ray covers it)")
def test_preflight_refuses_a_ray_address_without_ray_before_making_the_lake(tmp_path):
    lake = tmp_path / "lake"
    config = load_config(None, CODE_ON_RAY + [f'storage.lake_uri="{lake}"'])
    with pytest.raises(ConfigError, match="ray is not installed"):
        preflight(config)
    assert not lake.exists()  # refused before anything was written


def test_cluster_table_is_left_out_of_the_config_hash():
    # Where verification runs does not change a verdict: a run may resume on a cluster.
    local = load_config(None, ["envs.domains={code = 1.0}"])
    assert load_config(None, CODE_ON_RAY[:2] + ["cluster.ray_workers=4"]).config_hash() == local.config_hash()
    assert local.cluster.ray_address is None


def test_unknown_cluster_key_is_refused():
    with pytest.raises(ConfigError) as raised:
        load_config(None, ["cluster.ray_adress=\"127.0.0.1:6379\""])
    assert "ray_adress" in str(raised.value)
