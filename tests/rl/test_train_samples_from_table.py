"""The trainer worker's samples, made straight from a part's Arrow columns, equal those
train_samples makes from the same rows as Trajectory records: same order (a stable sort on
(task_id, sample_idx) as text and number), same values and Python types, unscored rows left
out, loss masks kept, old schema versions refused; every kind of part the lake holds reads
with only the trainer's columns."""

from __future__ import annotations

import dataclasses
import hashlib
import io
import random

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rlpipe.core.errors import ConfigError
from rlpipe.rl.samples import TRAIN_COLUMNS, train_samples, train_samples_from_table
from rlpipe.storage.lake import Lake
from rlpipe.storage.lake_records import PartRef
from rlpipe.storage.schema import from_table, to_part_table, to_table
from tests.helpers.trajectories import make_trajectories


def _mixed_rows() -> list:
    """Groups of 4 samples of two domains in shuffled order, task ids that sort differently
    as text than as numbers ("arithmetic-10" before "arithmetic-2") and outside ASCII,
    unscored rows, some with a loss mask, logprobs that float32 rounds, and rows that repeat
    another's (task_id, sample_idx) with other tokens (so only a stable sort keeps them as
    sorted() does)."""
    rows = make_trajectories("r", 2, 48) + make_trajectories("r", 2, 12, domain="ünï")
    rows = [row if index % 3 else dataclasses.replace(row, advantage=None) for index, row in enumerate(rows)]
    rows = [dataclasses.replace(row, completion=dataclasses.replace(row.completion, loss_mask=(1, 0)))
            if index % 4 == 1 else row for index, row in enumerate(rows)]
    rows = [dataclasses.replace(row, completion=dataclasses.replace(row.completion, logprobs=(-0.1 * index, -1.25)))
            for index, row in enumerate(rows)]
    rows += [dataclasses.replace(row, completion=dataclasses.replace(row.completion, token_ids=(7, index)))
             for index, row in enumerate(rows[:16:3])]
    random.Random(0).shuffle(rows)
    return rows


def test_samples_from_columns_equal_samples_from_rows() -> None:
    rows = _mixed_rows()
    table = to_table(rows).select(list(TRAIN_COLUMNS))
    from_columns = train_samples_from_table(table)
    assert from_columns == train_samples(from_table(to_table(rows)))  # the rows as the lake gives them back
    assert len(from_columns) == sum(row.advantage is not None for row in rows) > 0
    assert any(sample.loss_mask for sample in from_columns) and any(sample.loss_mask is None for sample in from_columns)
    assert {type(value) for sample in from_columns for value in sample.old_logprobs + sample.token_ids} == {float, int}
    assert train_samples_from_table(table.slice(0, 0)) == []


def test_rows_of_an_old_schema_version_are_refused_from_columns_too() -> None:
    rows = make_trajectories("r", 1, 3)
    rows[1] = dataclasses.replace(rows[1], schema_version=1, advantage=None)  # refused even where it would not train
    with pytest.raises(ConfigError, match="schema version 1"):
        train_samples_from_table(to_table(rows))


def _raw_part(lake: Lake, step: int, name: str, table: pa.Table) -> PartRef:
    """A part as an older rlpipe wrote it: `table`'s columns, as they are."""
    data = io.BytesIO()
    pq.write_table(table, data)
    relative = f"trajectories/run_id=r/step={step}/part-{name}.parquet"
    lake.objects.put(relative, data.getvalue())
    return PartRef(path=relative, rows=table.num_rows, sha256=hashlib.sha256(data.getvalue()).hexdigest())


def test_the_lake_reads_only_the_trainers_columns_of_every_kind_of_part(tmp_path) -> None:
    lake = Lake.open(str(tmp_path / "lake"))
    rows = _mixed_rows()
    parts = [
        lake.write_part("r", 2, "a", rows[:30]),
        lake.write_part("r", 2, "empty", []),
        lake.write_part("r", 2, "b", rows[30:]),
        # from before the loss_mask column: the column reads as null
        _raw_part(lake, 3, "no-mask", to_part_table(make_trajectories("r", 3, 4), "r", 3).drop_columns(["loss_mask"])),
        # schema version 1's layout: run_id and step inside the part as well as in its path
        _raw_part(lake, 4, "v1", to_table(make_trajectories("r", 4, 4))),
    ]
    table = lake.read_parts_table(parts, columns=TRAIN_COLUMNS)
    assert table.column_names == list(TRAIN_COLUMNS) and table.num_rows == len(rows) + 8
    assert table.column("loss_mask").to_pylist()[len(rows):len(rows) + 4] == [None] * 4
    assert train_samples_from_table(table) == train_samples(lake.read_parts(parts))
