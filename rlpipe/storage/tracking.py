"""MLflow tracking of RL runs: one MLflow run per RL run, metrics per step, plots, artifacts.

What it does: `resolve_tracking_uri` picks the tracking URI (configured; else the MLflow of
a running `rlpipe up`; else sqlite:///<cwd>/mlruns.db with artifacts in <cwd>/mlartifacts).
`Tracker` wraps an `MlflowClient` (never MLflow's fluent global state, so one process can
track several runs) and takes the MLflow run id in every call. Step metrics are
idempotent: a key that already has a point at a step is not logged again, and callers pass
the step manifest's commit time as the timestamp, so a retried or resumed step adds no
duplicate point. `log_step_metrics_soon` logs a step's metrics on a thread of the
tracker's own (storage/step_log_thread.py) while the caller goes on; `end_run` and
`settle` wait for it, and the tracker's metric and tag requests take one lock, so the two
threads never interleave in the store. MLflow and connection errors are translated
(storage/tracking_errors.py): unreachable or failing tracking server -> StorageUnavailable;
unknown run -> RunNotFoundError; rejected value -> UserError.

Artifact uploads fail within seconds, never minutes: before a run's first upload its
artifact store is checked once with one bounded request (`check_artifact_store`,
storage/artifact_checks.py: a HEAD of an s3:// bucket, or a listing through the MLflow
server that proxies mlflow-artifacts:/). A store that fails it raises StorageUnavailable
naming the bucket at once; before, MLflow's client retried the server's HTTP 500 for about
4.5 minutes per file. boto3's own upload errors are translated too.

What it does not: decide what to log or whether a failed upload is worth a warning or a
failed stage (tasks/ does), start an MLflow server (`rlpipe up` does), or retry (an http
server that vanishes mid-run is retried by MLflow's own HTTP client, then by Prefect).
"""

from __future__ import annotations

import fcntl
import io
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit

from matplotlib.figure import Figure
from mlflow import MlflowClient
from mlflow.entities import Metric, Param
from mlflow.exceptions import MlflowException

from rlpipe.core.errors import StorageUnavailable
from rlpipe.storage.artifact_checks import check_proxied_store, check_s3_bucket
from rlpipe.storage.lake import Lake
from rlpipe.storage.local_services import live_mlflow_uri, url_answers
from rlpipe.storage.mlflow_model import LoggedPolicy, log_policy_model
from rlpipe.storage.step_log_thread import StepLogThread
from rlpipe.storage.tracking_errors import artifact_errors, tracking_errors

MAX_PARAM_CHARS = 6000
PARAMS_PER_BATCH = 100
RUN_STATUSES = ("FINISHED", "FAILED", "KILLED")
END_WAIT_S = 10.0  # a failed or killed run waits this long at most for its last step's metrics


def resolve_tracking_uri(
    configured: str | None, state_dir: Path | None = None, cwd: Path | None = None
) -> str:
    """`configured`; else the MLflow of a live `rlpipe up` (state in `state_dir`, default
    $RLPIPE_HOME or ~/.rlpipe); else sqlite:///<cwd>/mlruns.db."""
    if configured:
        return configured
    running = live_mlflow_uri(state_dir)
    if running is not None:
        return running
    return f"sqlite:///{(cwd or Path.cwd()).resolve() / 'mlruns.db'}"


def default_artifact_location(uri: str) -> str | None:
    """For a sqlite store: the mlartifacts folder beside the database (a file:// URI)."""
    if not uri.startswith("sqlite:///"):
        return None
    database = Path(uri.removeprefix("sqlite:///"))
    return (database.parent / "mlartifacts").resolve().as_uri()


@contextmanager
def _sqlite_store_lock(uri: str) -> Iterator[None]:
    """For a sqlite store: hold an exclusive lock on `<database>.lock` while this process
    first opens it. MLflow creates and migrates the database on first use, and two runs
    started at once in one folder would otherwise race in that migration and both crash
    (`table _alembic_tmp_metrics already exists`). Other stores: nothing."""
    if not uri.startswith("sqlite:///"):
        yield
        return
    database = Path(uri.removeprefix("sqlite:///"))
    database.parent.mkdir(parents=True, exist_ok=True)
    with open(database.with_name(database.name + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


class Tracker:
    """Logs to one MLflow experiment. Every method takes the MLflow run id explicitly."""

    def __init__(self, uri: str, experiment: str, artifact_location: str | None = None) -> None:
        self.uri = uri
        self.experiment = experiment
        if urlsplit(uri).scheme in ("http", "https") and not url_answers(uri, timeout_s=3.0):
            raise StorageUnavailable(
                f"MLflow tracking server {uri} does not answer",
                hint="start it (`rlpipe up`) or fix tracking.mlflow_uri",
            )
        self._checked_artifact_roots: set[str] = set()
        self._latest: dict[str, dict[str, int]] = {}  # MLflow run id -> key -> highest step logged (see _latest_steps)
        self._metrics_lock = threading.RLock()  # the step log's thread and the caller share _latest and the store
        self._step_log = StepLogThread()
        with _sqlite_store_lock(uri):  # MlflowClient opens (creates, migrates) the store
            self._client = MlflowClient(tracking_uri=uri)
            self.experiment_id = self._experiment_id(artifact_location or default_artifact_location(uri))

    def _experiment_id(self, artifact_location: str | None) -> str:
        with tracking_errors(self.uri, f"opening experiment {self.experiment!r}"):
            found = self._client.get_experiment_by_name(self.experiment)
            if found is not None:
                if found.lifecycle_stage == "deleted":
                    self._client.restore_experiment(found.experiment_id)
                if EXPERIMENT_KIND_TAG not in found.tags:
                    self._client.set_experiment_tag(found.experiment_id, EXPERIMENT_KIND_TAG, EXPERIMENT_KIND)
                return str(found.experiment_id)
            try:
                return str(self._client.create_experiment(self.experiment, artifact_location, tags={EXPERIMENT_KIND_TAG: EXPERIMENT_KIND}))
            except MlflowException as exc:  # created by another process meanwhile
                again = self._client.get_experiment_by_name(self.experiment)
                if again is None:
                    raise exc
                return str(again.experiment_id)

    def start_run(
        self, run_name: str, tags: Mapping[str, str], params: Mapping[str, object]
    ) -> str:
        """Create a run with tags and params; return its MLflow run id."""
        with tracking_errors(self.uri, f"starting run {run_name!r}"):
            run = self._client.create_run(self.experiment_id, run_name=run_name, tags=dict(tags))
            run_id = str(run.info.run_id)
            entries = [Param(str(k), str(v)[:MAX_PARAM_CHARS]) for k, v in sorted(params.items())]
            for start in range(0, len(entries), PARAMS_PER_BATCH):
                self._client.log_batch(run_id, params=entries[start : start + PARAMS_PER_BATCH])
        return run_id

    def resume_run(self, mlflow_run_id: str) -> None:
        """Mark an existing run as running again (RunNotFoundError if the store lacks it)."""
        with self._metrics_lock, tracking_errors(self.uri, f"resuming run {mlflow_run_id}"):
            self._latest.pop(mlflow_run_id, None)  # read again from the store at the next log
            self._client.get_run(mlflow_run_id)
            self._client.update_run(mlflow_run_id, status="RUNNING")

    def log_step_metrics(
        self,
        mlflow_run_id: str,
        step: int,
        metrics: Mapping[str, float],
        timestamp_ms: int | None = None,
    ) -> int:
        """Log metrics at `step`, skipping keys that already have a point at this step.
        Returns how many points were logged."""
        stamp = timestamp_ms if timestamp_ms is not None else int(time.time() * 1000)
        with self._metrics_lock, tracking_errors(self.uri, f"logging metrics of step {step}"), self._latest_kept(mlflow_run_id):
            latest_steps = self._latest_steps(mlflow_run_id)
            fresh = [
                Metric(key, float(value), stamp, step)
                for key, value in sorted(metrics.items())
                if not self._has_point(mlflow_run_id, key, step, latest_steps.get(key))
            ]
            self._log_metrics(mlflow_run_id, fresh)
        return len(fresh)

    def log_step_metrics_soon(self, mlflow_run_id: str, step: int, metrics: Mapping[str, float], timestamp_ms: int) -> None:
        """`log_step_metrics` on the tracker's step-log thread (storage/step_log_thread.py):
        returns at once, after the log before it has settled (whose error is raised here)."""
        snapshot = dict(metrics)  # taken now: the caller may change its mapping while the thread logs
        self._step_log.submit(lambda: self.log_step_metrics(mlflow_run_id, step, snapshot, timestamp_ms))

    def settle(self, wait_s: float | None = None) -> None:
        """Wait for the step log in flight (StepLogThread.settle): its error is raised here."""
        self._step_log.settle(wait_s)

    def log_series(self, mlflow_run_id: str, key: str, points: list[tuple[int, float]]) -> int:
        """Log (step, value) points of one metric in one request, skipping those at or below
        the highest step already logged for `key` (a series that is re-run from its start,
        like a warm start after a crash, adds no duplicate point). Returns how many were logged."""
        if not points:
            return 0
        stamp = int(time.time() * 1000)
        with self._metrics_lock, tracking_errors(self.uri, f"logging {key}"), self._latest_kept(mlflow_run_id):
            latest = self._latest_steps(mlflow_run_id).get(key, -1)
            fresh = [Metric(key, float(value), stamp, step) for step, value in points if step > latest]
            self._log_metrics(mlflow_run_id, fresh)
        return len(fresh)

    def _latest_steps(self, mlflow_run_id: str) -> dict[str, int]:
        """Key -> highest step logged so far (MLflow keeps the max-step point as "latest").
        Read from the store once per run and process, then kept up to date by this
        Tracker's own logging (`_log_metrics`): a step's metrics cost one request, not two.
        One controller logs a run's metrics; the copy is dropped on any error (`_latest_kept`),
        so a failed or partly applied request is followed by a fresh read."""
        if mlflow_run_id not in self._latest:
            data = self._client.get_run(mlflow_run_id).data
            latest = getattr(data, "_metric_objs", None)  # Metric objects with their step
            if latest is None:  # unknown: force a history look-up
                self._latest[mlflow_run_id] = {key: 2**62 for key in data.metrics}
            else:
                self._latest[mlflow_run_id] = {metric.key: metric.step for metric in latest}
        return self._latest[mlflow_run_id]

    def _log_metrics(self, mlflow_run_id: str, metrics: list[Metric]) -> None:
        if not metrics:
            return
        self._client.log_batch(mlflow_run_id, metrics=metrics)
        latest = self._latest_steps(mlflow_run_id)
        for metric in metrics:
            latest[metric.key] = max(latest.get(metric.key, -1), metric.step)

    @contextmanager
    def _latest_kept(self, mlflow_run_id: str) -> Iterator[None]:
        """Drop the kept latest steps of the run when the body fails (see _latest_steps)."""
        try:
            yield
        except BaseException:
            self._latest.pop(mlflow_run_id, None)
            raise

    def _has_point(self, mlflow_run_id: str, key: str, step: int, latest_step: int | None) -> bool:
        """Whether `key` has a point at `step`; reads the history only when it could."""
        if latest_step is None or latest_step < step:
            return False  # the common case: steps only grow, one request per step
        return any(point.step == step for point in self._client.get_metric_history(mlflow_run_id, key))

    def metric_history(self, mlflow_run_id: str, key: str) -> list[tuple[int, float, int]]:
        """(step, value, timestamp_ms) of every point of a metric, by step."""
        with tracking_errors(self.uri, f"reading metric {key}"):
            points = self._client.get_metric_history(mlflow_run_id, key)
        return sorted((p.step, p.value, p.timestamp) for p in points)

    def set_tags(self, mlflow_run_id: str, tags: Mapping[str, str]) -> None:
        with self._metrics_lock, tracking_errors(self.uri, "setting tags"):
            for key, value in tags.items():
                self._client.set_tag(mlflow_run_id, key, value)

    def check_artifact_store(self, mlflow_run_id: str) -> str:
        """Check the run's artifact store once per root (see the module docstring); return
        the root. StorageUnavailable, within seconds, when it cannot take artifacts."""
        root = self.artifact_uri(mlflow_run_id)
        if root in self._checked_artifact_roots:
            return root
        scheme = urlsplit(root).scheme
        if scheme == "s3":
            check_s3_bucket(root)
        elif scheme in ("mlflow-artifacts", "http", "https"):
            check_proxied_store(root, self.uri)
        self._checked_artifact_roots.add(root)
        return root

    def log_artifact(self, mlflow_run_id: str, local_path: Path, artifact_path: str | None = None) -> None:
        """Upload a local file (or folder) into the run's artifacts."""
        root = self.check_artifact_store(mlflow_run_id)
        with artifact_errors(self.uri, root, f"logging artifact {local_path}"):
            self._client.log_artifact(mlflow_run_id, str(local_path), artifact_path)

    def log_policy_model(self, mlflow_run_id: str, folder: Path, name: str, step: int) -> LoggedPolicy:
        """The HF folder `folder` as a logged model of the run, registered as a version of
        `name` (storage/mlflow_model.py)."""
        root = self.check_artifact_store(mlflow_run_id)
        with artifact_errors(self.uri, root, f"logging the model {name!r}"):
            return log_policy_model(self._client, self.experiment_id, mlflow_run_id, folder, name, step)

    def log_text(self, mlflow_run_id: str, text: str, artifact_file: str) -> None:
        root = self.check_artifact_store(mlflow_run_id)
        with artifact_errors(self.uri, root, f"logging {artifact_file}"):
            self._client.log_text(mlflow_run_id, text, artifact_file)

    def log_curve(
        self,
        mlflow_run_id: str,
        points: list[tuple[int, float]],
        artifact_file: str = "plots/reward.png",
        title: str = "mean reward per step",
    ) -> None:
        """Plot (step, value) points as a PNG artifact."""
        png = reward_curve_png(points, title)
        with tempfile.TemporaryDirectory() as folder:
            target = Path(folder) / Path(artifact_file).name
            target.write_bytes(png)
            parent = str(Path(artifact_file).parent)
            self.log_artifact(mlflow_run_id, target, None if parent == "." else parent)

    def log_reward_curve(
        self, mlflow_run_id: str, lake: Lake, run_id: str, metric: str = "reward/mean"
    ) -> list[tuple[int, float]]:
        """Plot `metric` of every committed step of `run_id` (from the manifests); return the points."""
        points = []
        for step in lake.committed_steps(run_id):
            manifest = lake.read_manifest(run_id, step)
            value = manifest.metric(metric) if manifest is not None else None
            if value is not None:
                points.append((step, value))
        self.log_curve(mlflow_run_id, points, title=f"{metric} per step of {run_id}")
        return points

    def end_run(self, mlflow_run_id: str, status: str = "FINISHED") -> None:
        """Settle the step log in flight (at most END_WAIT_S unless FINISHED), then end the
        run; a step log that failed again is raised after the run is ended."""
        if status not in RUN_STATUSES:
            raise ValueError(f"status must be one of {RUN_STATUSES}, not {status!r}")
        try:
            self.settle(None if status == "FINISHED" else END_WAIT_S)
        finally:
            with self._metrics_lock, tracking_errors(self.uri, f"ending run {mlflow_run_id}"):
                self._client.set_terminated(mlflow_run_id, status=status)

    def run_status(self, mlflow_run_id: str) -> str:
        with tracking_errors(self.uri, f"reading run {mlflow_run_id}"):
            return str(self._client.get_run(mlflow_run_id).info.status)

    def find_run(self, tag: str, value: str) -> str | None:
        """The newest run of this experiment whose tag `tag` is `value`, else None (an eval
        resumed in a new process finds its MLflow run by its eval id)."""
        with tracking_errors(self.uri, f"searching runs with {tag}={value}"):
            quoted = value.replace("'", "\\'")
            runs = self._client.search_runs([self.experiment_id], filter_string=f"tags.`{tag}` = '{quoted}'",
                                            order_by=["attributes.start_time DESC"], max_results=1)
        return str(runs[0].info.run_id) if runs else None

    def artifact_uri(self, mlflow_run_id: str, artifact_path: str = "") -> str:
        """Where the run's artifact `artifact_path` is stored (a file:// path for a local store)."""
        with tracking_errors(self.uri, f"reading run {mlflow_run_id}"):
            root = str(self._client.get_run(mlflow_run_id).info.artifact_uri)
        return f"{root.rstrip('/')}/{artifact_path}" if artifact_path else root

    def log_bytes(self, mlflow_run_id: str, data: bytes, artifact_file: str) -> None:
        """Upload `data` as the run's artifact `artifact_file` (e.g. plots/x.png)."""
        with tempfile.TemporaryDirectory() as folder:
            target = Path(folder) / Path(artifact_file).name
            target.write_bytes(data)
            parent = str(Path(artifact_file).parent)
            self.log_artifact(mlflow_run_id, target, None if parent == "." else parent)

    def run_url(self, mlflow_run_id: str) -> str | None:
        """The run's page in the MLflow UI for an http(s) server, else None; in the UI's
        model-training view (see EXPERIMENT_KIND_TAG)."""
        if urlsplit(self.uri).scheme not in ("http", "https"):
            return None
        return f"{self.uri.rstrip('/')}/#/experiments/{self.experiment_id}/runs/{mlflow_run_id}?{TRAINING_VIEW_QUERY}"


# Which view the MLflow UI opens an experiment in. MLflow 3's UI reads the experiment tag
# mlflow.experimentKind ("custom_model_development": the classic training-runs view, not the
# GenAI traces view) where its workflow switch is off; MLflow 3.17's UI instead follows its
# own "workflowType" (kept per browser, GenAI by default), which a link sets with the query
# ?workflowType=machine_learning. rlpipe sets both (found in mlflow/server/js: the
# ExperimentKind enum and the workflowType context).
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
EXPERIMENT_KIND = "custom_model_development"
TRAINING_VIEW_QUERY = "workflowType=machine_learning"


def reward_curve_png(points: list[tuple[int, float]], title: str = "mean reward per step") -> bytes:
    """A PNG line plot of (step, value) points (matplotlib's Agg canvas, no pyplot state)."""
    figure = Figure(figsize=(6, 4), dpi=100)
    axes = figure.add_subplot()
    steps = [step for step, _ in points]
    values = [value for _, value in points]
    axes.plot(steps, values, marker="o")
    axes.set_xlabel("step")
    axes.set_ylabel("value")
    axes.set_title(title)
    axes.grid(True, alpha=0.3)
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    return buffer.getvalue()
