"""The lake's trajectories folder opens in pandas, pyarrow, DuckDB and Polars with their
defaults (the one-liners of docs/ARCHITECTURE.md) and give the rows `rlpipe query`'s
trajectories view gives (the rows set apart by dynamic sampling lie outside the folder), and the step_metrics view joins the
update's train metrics to the rollout metrics in one query."""

from __future__ import annotations

import hashlib
from pathlib import Path

import duckdb
import pandas as pd
import polars as pl
import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.parquet as pq
import pytest

from rlpipe.core.records import SCHEMA_VERSION
from rlpipe.storage.lake import Lake
from rlpipe.storage.lake_records import PartRef, StepManifest
from rlpipe.storage.query import metric_column, query_trajectories
from rlpipe.storage.schema import PART_SCHEMA, TRAJECTORY_SCHEMA, to_table
from tests.helpers.trajectories import make_trajectories

# two runs; steps 1, 2 and 10 (10 sorts before 2 as text: step must stay a number)
ROWS = {("run-a", 1): 3, ("run-a", 2): 2, ("run-a", 10): 4, ("run-b", 1): 5}
EXPECTED = sorted(ROWS.items())  # ((run_id, step), rows)
SET_APART = {("run-a", 2): 6, ("run-b", 1): 7}  # rows set apart, of domain "apart"


@pytest.fixture
def lake_root(tmp_path: Path) -> Path:
    root = tmp_path / "lake"
    lake = Lake.open(str(root))
    for (run_id, step), count in ROWS.items():
        part = lake.write_part(run_id, step, "00000", make_trajectories(run_id, step, count))
        apart = SET_APART.get((run_id, step), 0)  # dynamic sampling's rows: in the lake, not in trajectories/
        set_apart = (lake.write_set_apart(run_id, step, make_trajectories(run_id, step, apart, "apart")),) if apart else ()
        lake.commit_step(StepManifest(run_id=run_id, step=step, policy_version=step, parts=(part,), rows=count,
                                      metrics=(("reward/mean", step / 10),), committed_at_ms=step, set_apart=set_apart))
    return root


def _counts(pairs) -> list[tuple[tuple[str, int], int]]:
    counts: dict[tuple[str, int], int] = {}
    for run_id, step in pairs:
        key = (str(run_id), int(step))
        counts[key] = counts.get(key, 0) + 1
    return sorted(counts.items())


def test_parts_hold_no_partition_columns(lake_root: Path):
    part = next((lake_root / "trajectories").rglob("*.parquet"))
    assert pq.read_schema(part).names == PART_SCHEMA.names
    assert "run_id" not in PART_SCHEMA.names and "step" not in PART_SCHEMA.names


def test_pandas_reads_the_folder(lake_root: Path):
    frame = pd.read_parquet(lake_root / "trajectories")
    assert _counts(zip(frame["run_id"], frame["step"])) == EXPECTED
    assert set(frame["schema_version"]) == {SCHEMA_VERSION}


def test_pyarrow_read_table_reads_the_folder(lake_root: Path):
    table = pq.read_table(lake_root / "trajectories")
    assert _counts(zip(table["run_id"].to_pylist(), table["step"].to_pylist())) == EXPECTED


def test_pyarrow_hive_dataset_reads_the_folder(lake_root: Path):
    table = pads.dataset(lake_root / "trajectories", partitioning="hive").to_table()
    assert _counts(zip(table["run_id"].to_pylist(), table["step"].to_pylist())) == EXPECTED
    assert table.schema.field("step").type == pa.int32()  # what pyarrow infers from the path


def test_duckdb_reads_the_folder(lake_root: Path):
    rows = duckdb.sql(
        f"select run_id, step, count(*) from read_parquet('{lake_root}/trajectories/**/*.parquet', "
        "hive_partitioning = true) group by all order by all"
    ).fetchall()
    assert [((run_id, step), n) for run_id, step, n in rows] == EXPECTED


def test_polars_reads_and_scans_the_folder(lake_root: Path):
    frame = pl.read_parquet(lake_root / "trajectories", hive_partitioning=True)
    assert _counts(zip(frame["run_id"], frame["step"])) == EXPECTED
    scanned = (pl.scan_parquet(f"{lake_root}/trajectories/**/*.parquet", hive_partitioning=True)
               .group_by("run_id", "step").len().collect())
    assert sorted(((r, s), n) for r, s, n in scanned.iter_rows()) == EXPECTED


def test_every_reader_sees_the_rows_rlpipe_trains_on(lake_root: Path):
    result = query_trajectories(Lake.open(str(lake_root)), "select count(*), avg(reward), count(distinct domain) from trajectories")
    frame = pd.read_parquet(lake_root / "trajectories")
    scanned = duckdb.sql(f"select count(*), avg(reward), count(distinct domain) from "
                         f"read_parquet('{lake_root}/trajectories/**/*.parquet', hive_partitioning = true)").fetchall()
    polars = pl.scan_parquet(f"{lake_root}/trajectories/**/*.parquet", hive_partitioning=True).collect()
    assert result.rows == scanned == [(len(frame), frame["reward"].mean(), 1)] == [(len(polars), polars["reward"].mean(), 1)]
    assert set(frame["domain"]) == {"arithmetic"}  # none of the set-apart rows


def test_the_set_apart_rows_read_as_a_folder_of_their_own(lake_root: Path):
    frame = pd.read_parquet(lake_root / "set_apart")
    assert _counts(zip(frame["run_id"], frame["step"])) == sorted(SET_APART.items()) and set(frame["domain"]) == {"apart"}
    result = query_trajectories(Lake.open(str(lake_root)), "select run_id, step, count(*) from set_apart group by all order by all")
    assert [((run_id, step), n) for run_id, step, n in result.rows] == sorted(SET_APART.items())


def test_rlpipe_reads_give_run_id_and_step_back(lake_root: Path):
    lake = Lake.open(str(lake_root))
    manifest = lake.read_manifest("run-a", 10)
    assert lake.read_parts(manifest.parts) == make_trajectories("run-a", 10, 4)
    result = query_trajectories(lake, "select run_id, step, count(*) from trajectories group by all order by all")
    assert [((run_id, step), n) for run_id, step, n in result.rows] == EXPECTED


def test_a_version_1_part_with_partition_columns_inside_still_reads(tmp_path: Path):
    lake = Lake.open(str(tmp_path / "lake"))
    rows = make_trajectories("old", 3, 2)
    relative = "trajectories/run_id=old/step=3/part-00000.parquet"
    path = tmp_path / "lake" / relative
    path.parent.mkdir(parents=True)
    pq.write_table(to_table(rows), path)  # version 1 wrote every column of TRAJECTORY_SCHEMA
    ref = PartRef(path=relative, rows=2, sha256=hashlib.sha256(path.read_bytes()).hexdigest())
    assert lake.read_parts_table([ref]).schema == TRAJECTORY_SCHEMA
    assert lake.read_parts([ref]) == rows


def test_a_part_refuses_rows_of_another_step(tmp_path: Path):
    lake = Lake.open(str(tmp_path / "lake"))
    with pytest.raises(ValueError, match="cannot hold rows"):
        lake.write_part("r", 1, "00000", make_trajectories("r", 2, 1))


def test_step_metrics_joins_train_metrics_to_rollout_metrics(lake_root: Path):
    lake = Lake.open(str(lake_root))
    lake.record_train_metrics("run-a", 1, {"train/loss": 0.75, "train/kl": 0.01, "time/update_s": 2.0})
    lake.record_train_metrics("run-a", 2, {"train/loss": 0.5, "time/update_s": 1.0})
    # a replayed update brings train/* again, not the timings: those stay
    lake.record_train_metrics("run-a", 2, {"train/loss": 0.25})
    result = query_trajectories(lake, "select step, reward_mean, loss, kl, time_update_s from step_metrics "
                                      "where run_id = 'run-a' order by step")
    assert result.columns == ("step", "reward_mean", "loss", "kl", "time_update_s")
    # reward_mean is step / 10 (the fixture's manifests); step 10 has no train metrics
    assert result.rows == [(1, 0.1, 0.75, 0.01, 2.0), (2, 0.2, 0.25, None, 1.0), (10, 1.0, None, None, None)]
    long = query_trajectories(lake, "select name, value from step_metric_values where run_id = 'run-a' and step = 2 "
                                    "order by name")
    assert long.rows == [("reward/mean", 0.2), ("time/update_s", 1.0), ("train/loss", 0.25)]


def test_train_metrics_need_a_committed_step(tmp_path: Path):
    lake = Lake.open(str(tmp_path / "lake"))
    with pytest.raises(ValueError, match="not committed"):
        lake.record_train_metrics("r", 1, {"train/loss": 1.0})


def test_metric_columns_drop_the_train_prefix_and_slashes():
    assert [metric_column(n) for n in ("train/loss", "reward/mean", "reward/my-domain", "time/step_s")] == \
        ["loss", "reward_mean", "reward_my_domain", "time_step_s"]


def test_runs_show_counts_per_step_agree_with_the_folders(lake_root: Path):
    from rlpipe.cli.runs import rows_line, rows_per_step

    lake = Lake.open(str(lake_root))
    per_step = rows_per_step(lake, "run-a", lake.committed_steps("run-a"))
    trained = pd.read_parquet(lake_root / "trajectories" / "run_id=run-a")
    apart = pd.read_parquet(lake_root / "set_apart" / "run_id=run-a")
    assert [(row["step"], row["trained"]) for row in per_step] == [(step, int((trained["step"] == step).sum())) for step in (1, 2, 10)]
    assert [(row["step"], row["set_apart"]) for row in per_step] == [(step, int((apart["step"] == step).sum())) for step in (1, 2, 10)]
    line = rows_line(per_step)
    assert f"{len(trained)} trained on, {len(apart)} set apart" in line and "step 10: 4 trained on, 0 set apart" in line
