"""A run whose stored trajectories have an older schema version is not resumed: schema 1
stored temperature-1 logprobs, which the trainer (at the sampling temperature) no longer
matches, so replaying or continuing such a run would train on wrong importance ratios."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from rlpipe.core.errors import ConfigError
from rlpipe.core.records import SCHEMA_VERSION
from rlpipe.flows.train import train
from rlpipe.rl import samples
from rlpipe.tasks import lifecycle
from tests.flows.runs import tiny_config
from tests.helpers.trajectories import make_trajectory


def test_resume_of_a_run_with_older_rows_is_refused_with_a_hint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tiny_config(tmp_path, "train.steps=1")
    train(config, "old-rows")
    # This rlpipe now claims one version more than the rows it just wrote: they are "old".
    monkeypatch.setattr(lifecycle, "SCHEMA_VERSION", SCHEMA_VERSION + 1)
    monkeypatch.setattr(samples, "SCHEMA_VERSION", SCHEMA_VERSION + 1)
    longer = tiny_config(tmp_path, "train.steps=2")
    with pytest.raises(ConfigError, match=f"schema version {SCHEMA_VERSION} \\(step 1\\)") as refused:
        train(longer, "old-rows")
    assert "start a new run" in refused.value.hint and "temperature-1 logprobs" in refused.value.hint


def test_old_rows_never_reach_the_trainer() -> None:
    row = make_trajectory("r", 1, 0)
    assert len(samples.train_samples([row])) == 1  # the current version trains
    with pytest.raises(ConfigError, match="schema version 1 reached the trainer"):
        samples.train_samples([row, dataclasses.replace(row, schema_version=1)])
