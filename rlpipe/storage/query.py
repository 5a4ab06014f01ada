"""SQL over the lake with DuckDB: committed trajectories and step metrics as views.

What it does: `query_trajectories(lake, sql)` runs one SQL statement in a fresh in-memory
DuckDB connection that has these views:

    trajectories        every row of every part listed in a committed manifest (TRAJECTORY_SCHEMA)
    set_apart           the rows committed steps generated and did not train on (dynamic
                        sampling's groups without signal and surplus groups), same columns
    steps               run_id, step, policy_version, rows, committed_at_ms   (one per manifest)
    step_metrics        run_id, step, then one column per metric: the manifest's rollout
                        metrics and the after-commit ones of TRAIN.json (the update's
                        train/*, the timings time/*), named by `metric_column`
                        ("reward/mean" -> reward_mean, "train/loss" -> loss); one row per
                        committed step, null where a step lacks a metric
    step_metric_values  run_id, step, name, value: the same metrics, one row each, by full name

    evals               eval_id, agent, backend, tasks_dir, tasks, max_attempts, created_at_ms
                        (one per `rlpipe eval`, storage/evals.py)
    eval_trials         every committed trial attempt (EVAL_TRIAL_SCHEMA) plus `final`: true
                        for the last attempt of each (eval_id, task_id), the one that counts
    eval_steps          every step of every committed attempt (EVAL_STEP_SCHEMA)
    rescores            every row of every committed `rlpipe rescore` (RESCORE_SCHEMA, storage/rescores.py):
                        the old verdict beside the current verifier's, `flip` where they differ

`stream_query(lake, sql)` runs the same statement over the same views and hands its result
over as Arrow record batches read from DuckDB as they are consumed (`rlpipe query` prints
them so, memory bounded by a batch); `query_trajectories` returns every row at once.

So `select step, reward_mean, loss from step_metrics` joins the update's loss to the
step's reward in one query, and `select verdict, count(*) from eval_trials where final
group by 1` counts an eval's verdicts.

Parts are reached only through manifests, so a part orphaned by a crash is never counted.
The parts are scanned through a pyarrow dataset on the lake's own filesystem (local or S3),
which DuckDB reads lazily with column projection and filter pushdown. DuckDB's httpfs
extension is not used: DuckDB downloads extensions from the internet on first use, which
an offline machine cannot do, and the pyarrow route needs no second set of S3 settings.

What it does not: verify part digests (Lake.read_parts does), cache anything between
calls, or stop a statement from reading other files DuckDB can reach (it is a local,
read-mostly analyst tool; the lake itself cannot be written through it).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import duckdb
import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.fs as pafs

from rlpipe.core.errors import RunNotFoundError, StorageUnavailable, UserError
from rlpipe.storage.eval_records import EVAL_STEP_SCHEMA, EVAL_TRIAL_SCHEMA
from rlpipe.storage.evals import EvalStore
from rlpipe.storage.lake import Lake, set_apart_path
from rlpipe.storage.lake_records import PartRef, StepManifest
from rlpipe.storage.rescores import RESCORE_SCHEMA, RescoreStore
from rlpipe.storage.schema import PARTITION_COLUMNS, TRAJECTORY_SCHEMA

_USER_SQL_ERRORS = (
    duckdb.ParserException,
    duckdb.BinderException,
    duckdb.CatalogException,
    duckdb.ConversionException,
    duckdb.OutOfRangeException,
    duckdb.TypeMismatchException,
    duckdb.InvalidInputException,
    duckdb.NotImplementedException,
    duckdb.SyntaxException,
    duckdb.ConstraintException,
)


def _is_scan_failure(exc: duckdb.Error) -> bool:
    """DuckDB reports a failed read of a registered Arrow dataset as invalid input."""
    return "reading the stream registered as" in str(exc)


@dataclass(frozen=True)
class QueryResult:
    """Column names and rows (tuples of Python values) of one statement."""

    columns: tuple[str, ...]
    rows: list[tuple[object, ...]]


def _part_paths(lake: Lake, parts: list[PartRef]) -> list[str]:
    """The filesystem paths of committed parts: a set-apart part that a manifest of the
    older layout lists under trajectories/ is read under set_apart/ once moved there."""
    relative = [part.path for part in parts]
    legacy = [path for path in relative if set_apart_path(path) != path]
    moved: set[str] = set()
    if legacy:
        infos = lake.location.filesystem.get_file_info([lake.location.path(path) for path in legacy])
        moved = {path for path, info in zip(legacy, infos) if info.type != pafs.FileType.File}
    return [lake.location.path(set_apart_path(path) if path in moved else path) for path in relative]


def _trajectory_dataset(lake: Lake, manifests: list[StepManifest], set_apart: bool = False) -> pads.Dataset:
    paths = _part_paths(lake, [part for m in manifests for part in (m.set_apart if set_apart else m.parts)])
    if not paths:
        return pads.dataset(TRAJECTORY_SCHEMA.empty_table())
    # run_id and step come from each part's hive path (they are not inside the files); the
    # base is the lake root, as parts lie under trajectories/ or set_apart/
    partitioning = pads.partitioning(
        pa.schema([TRAJECTORY_SCHEMA.field(name) for name in PARTITION_COLUMNS]), flavor="hive"
    )
    return pads.dataset(
        paths, schema=TRAJECTORY_SCHEMA, format="parquet", filesystem=lake.location.filesystem,
        partitioning=partitioning, partition_base_dir=lake.location.path(""),
    )


def _steps_table(manifests: list[StepManifest]) -> pa.Table:
    return pa.table(
        {
            "run_id": pa.array([m.run_id for m in manifests], pa.string()),
            "step": pa.array([m.step for m in manifests], pa.int64()),
            "policy_version": pa.array([m.policy_version for m in manifests], pa.int64()),
            "rows": pa.array([m.rows for m in manifests], pa.int64()),
            "committed_at_ms": pa.array([m.committed_at_ms for m in manifests], pa.int64()),
        }
    )


def metric_column(name: str) -> str:
    """The step_metrics column of a metric: `train/` dropped, other characters than letters,
    digits and '_' made '_' ("reward/mean" -> reward_mean, "train/loss" -> loss)."""
    return re.sub(r"[^0-9A-Za-z_]", "_", name.removeprefix("train/"))


def _step_metric_points(lake: Lake, manifests: list[StepManifest]) -> list[tuple[str, int, str, float]]:
    """(run_id, step, name, value) of every manifest metric, then every after-commit one."""
    points = []
    for manifest in manifests:
        points += [(manifest.run_id, manifest.step, name, value) for name, value in manifest.metrics]
        after = lake.read_train_metrics(manifest.run_id, manifest.step)
        if after is not None:
            points += [(manifest.run_id, manifest.step, name, value) for name, value in after.metrics]
    return points


def _step_metric_values_table(points: list[tuple[str, int, str, float]]) -> pa.Table:
    return pa.table(
        {
            "run_id": pa.array([p[0] for p in points], pa.string()),
            "step": pa.array([p[1] for p in points], pa.int64()),
            "name": pa.array([p[2] for p in points], pa.string()),
            "value": pa.array([p[3] for p in points], pa.float64()),
        }
    )


def _step_metrics_table(manifests: list[StepManifest], points: list[tuple[str, int, str, float]]) -> pa.Table:
    """One row per committed step, one column per metric name (null where a step lacks it)."""
    columns: dict[str, str] = {}  # metric name -> column
    for name in sorted({p[2] for p in points}):
        column = metric_column(name)
        if column in columns.values() or column in ("run_id", "step"):
            column = re.sub(r"[^0-9A-Za-z_]", "_", name)  # a clash: this one keeps its prefix
        columns[name] = column
    index = {(m.run_id, m.step): i for i, m in enumerate(manifests)}
    values = {column: [None] * len(manifests) for column in columns.values()}
    for run_id, step, name, value in points:
        values[columns[name]][index[(run_id, step)]] = value
    return pa.table(
        {
            "run_id": pa.array([m.run_id for m in manifests], pa.string()),
            "step": pa.array([m.step for m in manifests], pa.int64()),
            **{column: pa.array(values[column], pa.float64()) for column in sorted(values)},
        }
    )


def _parquet_dataset(lake: Lake, paths: list[str], schema: pa.Schema) -> pads.Dataset:
    if not paths:
        return pads.dataset(schema.empty_table())
    return pads.dataset(paths, schema=schema, format="parquet", filesystem=lake.location.filesystem)


def _eval_tables(lake: Lake) -> dict[str, pads.Dataset | pa.Table]:
    """The registered sources of the evals, eval_trials and eval_steps views."""
    store = EvalStore(lake)
    infos = [info for info in map(store.read_info, store.list_evals()) if info is not None]
    commits = store.commits()
    evals = pa.table({
        "eval_id": pa.array([i.eval_id for i in infos], pa.string()),
        "agent": pa.array([i.agent for i in infos], pa.string()),
        "backend": pa.array([i.backend for i in infos], pa.string()),
        "tasks_dir": pa.array([i.tasks_dir for i in infos], pa.string()),
        "tasks": pa.array([len(i.task_ids) for i in infos], pa.int64()),
        "max_attempts": pa.array([i.max_attempts for i in infos], pa.int64()),
        "created_at_ms": pa.array([i.created_at_ms for i in infos], pa.int64()),
    })
    return {"_evals": evals, "_eval_trials": _parquet_dataset(lake, store.part_paths(commits, "trial"), EVAL_TRIAL_SCHEMA),
            "_eval_steps": _parquet_dataset(lake, store.part_paths(commits, "steps"), EVAL_STEP_SCHEMA)}


_VIEWS_HINT = "views: trajectories, set_apart, rescores, steps, step_metrics, step_metric_values, evals, eval_trials, eval_steps"


def query_trajectories(lake: Lake, sql: str, run_id: str | None = None) -> QueryResult:
    """Run `sql` over the committed lake (one run when `run_id` is given); every row of
    the result in memory, as DuckDB's Python values (`stream_query` for a result of any size).

    Bad SQL -> UserError with DuckDB's message; a lake that cannot be read ->
    StorageUnavailable.
    """
    connection = _connect(lake, run_id)
    try:
        cursor = connection.execute(sql)
        if cursor.description is None:
            return QueryResult(columns=(), rows=[])
        columns = tuple(column[0] for column in cursor.description)
        return QueryResult(columns=columns, rows=[tuple(row) for row in cursor.fetchall()])
    except duckdb.Error as exc:
        raise _query_error(lake, exc) from exc
    finally:
        connection.close()


@dataclass
class QueryStream:
    """The columns of a statement's result and its rows as Arrow record batches of at most
    `batch_rows` rows, read from DuckDB as they are iterated (a failed read raises as
    query_trajectories does)."""

    columns: tuple[str, ...]
    batches: Iterator[pa.RecordBatch]


def rows_of(batch: pa.RecordBatch) -> list[tuple[object, ...]]:
    """The rows of a record batch as tuples of Python values; DuckDB's HUGEINT (a sum of
    integers, Arrow decimal128(38, 0)) as an int, as `query_trajectories` gives it."""
    columns = []
    for column in batch.columns:
        values = column.to_pylist()
        if pa.types.is_decimal(column.type) and column.type.scale == 0:
            values = [None if value is None else int(value) for value in values]
        columns.append(values)
    return list(zip(*columns)) if columns else []


@contextmanager
def stream_query(lake: Lake, sql: str, run_id: str | None = None, batch_rows: int = 1024) -> Iterator[QueryStream]:
    """Run `sql` over the committed lake and stream its result: DuckDB hands the rows over
    in Arrow record batches as they are read, so memory holds a batch, not the result (as
    far as the statement allows: a sort or an aggregate holds what it needs inside DuckDB)."""
    connection = _connect(lake, run_id)
    try:
        try:
            relation = connection.sql(sql)
            if relation is None:  # a statement without a result (SET, CREATE VIEW ...)
                yield QueryStream(columns=(), batches=iter(()))
                return
            columns = tuple(relation.columns)
            reader = relation.to_arrow_reader(batch_rows)
        except duckdb.Error as exc:
            raise _query_error(lake, exc) from exc
        yield QueryStream(columns=columns, batches=_read_batches(lake, reader))
    finally:
        connection.close()


def _read_batches(lake: Lake, reader: pa.RecordBatchReader) -> Iterator[pa.RecordBatch]:
    while True:
        try:
            batch = reader.read_next_batch()
        except StopIteration:
            return
        except duckdb.Error as exc:
            raise _query_error(lake, exc) from exc
        except (OSError, pa.ArrowException) as exc:
            raise StorageUnavailable(f"the query could not read the lake {lake.uri}: {exc}",
                                     hint="check that the lake is reachable; a missing part means a committed file was lost") from exc
        yield batch


def _query_error(lake: Lake, exc: duckdb.Error) -> Exception:
    """UserError for bad SQL, StorageUnavailable for a lake that cannot be read."""
    if isinstance(exc, _USER_SQL_ERRORS) and not _is_scan_failure(exc):
        return UserError(f"the query failed: {exc}", hint=_VIEWS_HINT)
    if isinstance(exc, _USER_SQL_ERRORS):
        return StorageUnavailable(f"the query could not read the lake {lake.uri}: {exc}",
                                  hint="check that the lake is reachable; a missing part means a committed file was lost")
    return StorageUnavailable(f"the query could not read the lake {lake.uri}: {exc}",
                              hint="check that the lake's disk or S3 endpoint is reachable")


def _connect(lake: Lake, run_id: str | None) -> duckdb.DuckDBPyConnection:
    """A fresh in-memory DuckDB connection with the views of the module docstring."""
    if run_id is not None and lake.read_run_info(run_id) is None and not lake.committed_steps(run_id):
        raise RunNotFoundError(
            f"the lake {lake.uri} holds no run {run_id!r}", hint="list runs with `rlpipe runs`"
        )
    manifests = lake.committed_manifests(run_id)
    points = _step_metric_points(lake, manifests)
    try:
        dataset = _trajectory_dataset(lake, manifests)
        set_apart_dataset = _trajectory_dataset(lake, manifests, set_apart=True)
        eval_tables = _eval_tables(lake)
        rescore_store = RescoreStore(lake)
        eval_tables["_rescores"] = _parquet_dataset(lake, rescore_store.part_paths(rescore_store.manifests(run_id)), RESCORE_SCHEMA)
    except (OSError, pa.ArrowException) as exc:  # FileNotFoundError included: a lost part
        raise StorageUnavailable(
            f"the query could not open the committed parts of {lake.uri}: {exc}",
            hint="check that the lake is reachable; a missing part means a committed file was lost",
        ) from exc
    connection = duckdb.connect(":memory:")
    try:
        connection.register("_trajectories", dataset)
        connection.register("_steps", _steps_table(manifests))
        connection.register("_step_metrics", _step_metrics_table(manifests, points))
        connection.register("_step_metric_values", _step_metric_values_table(points))
        connection.register("_set_apart", set_apart_dataset)
        connection.execute("CREATE VIEW trajectories AS SELECT * FROM _trajectories")
        connection.execute("CREATE VIEW set_apart AS SELECT * FROM _set_apart")
        connection.execute("CREATE VIEW steps AS SELECT * FROM _steps")
        connection.execute("CREATE VIEW step_metrics AS SELECT * FROM _step_metrics")
        connection.execute("CREATE VIEW step_metric_values AS SELECT * FROM _step_metric_values")
        for name, source in eval_tables.items():
            connection.register(name, source)
        connection.execute("CREATE VIEW evals AS SELECT * FROM _evals")
        connection.execute("CREATE VIEW eval_trials AS SELECT *, attempt = max(attempt) OVER (PARTITION BY eval_id, task_id) "
                           "AS final FROM _eval_trials")
        connection.execute("CREATE VIEW eval_steps AS SELECT * FROM _eval_steps")
        connection.execute("CREATE VIEW rescores AS SELECT * FROM _rescores")
    except BaseException:
        connection.close()
        raise
    return connection
