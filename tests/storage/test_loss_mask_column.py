"""The nullable `loss_mask` column (multi-turn episodes): it round-trips, single-turn rows
store null, and parts written before the column existed read back with loss_mask None."""

from __future__ import annotations

import dataclasses

import pyarrow.dataset as pads
import pyarrow.parquet as pq

from rlpipe.storage.schema import PART_SCHEMA, from_table, to_part_table, to_table, with_partition_columns
from tests.helpers.trajectories import make_trajectories


def test_loss_mask_round_trips_and_is_null_on_single_turn_rows():
    plain, episode = make_trajectories("r", 1, 2)
    mask = tuple(i % 2 for i in range(len(episode.completion.token_ids)))
    episode = dataclasses.replace(episode, completion=dataclasses.replace(episode.completion, loss_mask=mask))
    table = to_table([plain, episode])
    assert table.column("loss_mask").to_pylist() == [None, list(mask)]
    assert from_table(table) == [plain, episode]


def test_a_part_without_the_column_reads_as_before(tmp_path):
    rows = make_trajectories("old-run", 3, 4)
    old = to_part_table(rows, "old-run", 3).drop_columns(["loss_mask"])  # a part from before the column
    assert from_table(with_partition_columns(old, "old-run", 3)) == rows  # Lake.read_parts' path
    pq.write_table(old, tmp_path / "part-0.parquet")
    # `rlpipe query` opens parts as a dataset with the current schema: the column reads as null
    table = pads.dataset(str(tmp_path / "part-0.parquet"), schema=PART_SCHEMA, format="parquet").to_table()
    assert table.column("loss_mask").to_pylist() == [None] * 4
