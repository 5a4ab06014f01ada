"""The trainer worker's samples, made straight from a part's Arrow columns, equal those the
library loop makes from Trajectory rows: same order, same values, unscored rows left out,
loss masks kept, old schema versions refused; and a part written before the loss_mask
column reads with the column null."""

from __future__ import annotations

import dataclasses
import hashlib
import io
import random

import pyarrow.parquet as pq
import pytest

from rlpipe.core.errors import ConfigError
from rlpipe.rl.samples import TRAIN_COLUMNS, train_samples, train_samples_from_table
from rlpipe.storage.lake import Lake
from rlpipe.storage.lake_records import PartRef
from rlpipe.storage.schema import to_part_table, to_table
from tests.helpers.trajectories import make_trajectories


def _mixed_rows() -> list:
    """Groups of 4 samples of two domains in shuffled order, task ids that sort differently
    as text than as numbers ("arithmetic-10" before "arithmetic-2") and outside ASCII,
    unscored rows, and some with a loss mask."""
    rows = make_trajectories("r", 2, 48) + make_trajectories("r", 2, 12, domain="ünï")
    rows = [row if index % 3 else dataclasses.replace(row, advantage=None) for index, row in enumerate(rows)]
    rows = [dataclasses.replace(row, completion=dataclasses.replace(row.completion, loss_mask=(1, 0)))
            if index % 4 == 1 else row for index, row in enumerate(rows)]
    random.Random(0).shuffle(rows)
    return rows


def test_samples_from_columns_equal_samples_from_rows() -> None:
    rows = _mixed_rows()
    from_columns = train_samples_from_table(to_table(rows).select(list(TRAIN_COLUMNS)))
    assert from_columns == train_samples(rows)
    assert len(from_columns) == sum(row.advantage is not None for row in rows) > 0
    assert any(sample.loss_mask for sample in from_columns) and any(sample.loss_mask is None for sample in from_columns)


def test_rows_of_an_old_schema_version_are_refused_from_columns_too() -> None:
    rows = make_trajectories("r", 1, 3)
    rows[1] = dataclasses.replace(rows[1], schema_version=1)
    with pytest.raises(ConfigError, match="schema version 1"):
        train_samples_from_table(to_table(rows))


def test_the_lake_reads_only_the_trainers_columns_and_fills_a_missing_loss_mask(tmp_path) -> None:
    lake = Lake.open(str(tmp_path / "lake"))
    rows = _mixed_rows()
    part = lake.write_part("r", 2, "a", rows)
    table = lake.read_parts_table([part], columns=TRAIN_COLUMNS)
    assert table.column_names == list(TRAIN_COLUMNS)
    assert train_samples_from_table(table) == train_samples(lake.read_parts([part]))
    # a part from before the loss_mask column: the column reads as null
    data = io.BytesIO()
    pq.write_table(to_part_table(make_trajectories("r", 3, 4), "r", 3).drop_columns(["loss_mask"]), data)
    relative = "trajectories/run_id=r/step=3/part-old.parquet"
    lake.objects.put(relative, data.getvalue())
    old = PartRef(path=relative, rows=4, sha256=hashlib.sha256(data.getvalue()).hexdigest())
    table = lake.read_parts_table([old], columns=TRAIN_COLUMNS)
    assert table.column("loss_mask").to_pylist() == [None] * 4
    assert train_samples_from_table(table) == train_samples(lake.read_parts([old]))
