"""kill -9 a full training run at several moments, resume each, and compare with an
uninterrupted run of the same config: the script form of tests/durability/test_kill_resume.py
for configs/quickstart.toml (or any config). Not run in CI: on a laptop CPU it takes about
(1 + 2 x moments) quickstart runs, half of them in parallel with --parallel 2.

    .venv/bin/python scripts/kill_resume_quickstart.py [--config configs/quickstart.toml]
        [--workdir /tmp/kill-resume] [--parallel 2] [--moments generate,verify,...]

Each moment arms one failpoint (rlpipe/core/failpoints.py) so that the process SIGKILLs
itself there; then `rlpipe resume RUN --lake LAKE` finishes the run. Every run has its own
lake and MLflow store under --workdir and uses one thread for torch (the same float
reductions in every run). Prints one table row per moment and exits 1 if any check fails.

Checks per moment: the killed run died by SIGKILL (-9); the resumed run finished; a
manifest for every step; `rlpipe query`'s row count = steps x prompts x group with no
duplicate (run_id, step, task_id, sample_idx); the same completion text, reward and
advantage per key as the reference; no *.parquet file under trajectories/ that no manifest
lists; final model.safetensors tensors bit-equal to the reference's; MLflow: one point per
step for reward/mean and train/loss, equal to the reference's values.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

import torch  # noqa: E402
from mlflow.tracking import MlflowClient  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

from rlpipe.core.config import RunConfig, load_config  # noqa: E402
from rlpipe.storage.lake import Lake  # noqa: E402
from rlpipe.storage.query import query_trajectories  # noqa: E402

MOMENTS = ("generate", "verify", "update", "part-write", "checkpoint-write", "warmstart")


@dataclass
class Result:
    moment: str
    failpoint: str
    killed_rc: int | None = None
    committed_at_kill: str = ""
    resume_rc: int | None = None
    checks: dict[str, bool] | None = None
    seconds: float = 0.0
    error: str = ""


PREFECT_API_URL = ""  # set by main(): one Prefect server for every run of the script


@dataclass
class Finished:
    returncode: int
    stderr: str


def run_cli(args: list[str], folder: Path, failpoints: str | None = None, timeout_s: float = 7200) -> Finished:
    """Run `rlpipe ARGS` with output to a log file in `folder` (not a pipe: a child that
    outlives a killed CLI would hold a pipe open and hang the wait)."""
    env = dict(os.environ, RLPIPE_HOME=str(folder / "rlpipe-home"), PREFECT_HOME=str(folder / "prefect-home"),
               OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PREFECT_LOGGING_LEVEL="WARNING",
               PREFECT_API_URL=PREFECT_API_URL)
    env.pop("RLPIPE_FAILPOINTS", None)
    if failpoints:
        env["RLPIPE_FAILPOINTS"] = failpoints
    log = folder / f"{args[0]}-{'killed' if failpoints else 'run'}.log"
    with open(log, "w") as out:
        process = subprocess.run([sys.executable, "-m", "rlpipe.cli.main", *args], cwd=folder, env=env,
                                 stdout=out, stderr=subprocess.STDOUT, timeout=timeout_s)
    return Finished(process.returncode, log.read_text()[-3000:])


def start_prefect_server(workdir: Path) -> subprocess.Popen[bytes]:
    """A Prefect server on a free loopback port for all runs, so that the killed and resumed
    runs' flow runs stay on one server (each `rlpipe train` without one starts a temporary
    server of its own that ends with it)."""
    import socket
    import urllib.request

    global PREFECT_API_URL
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = dict(os.environ, PREFECT_HOME=str(workdir / "prefect-server"))
    with open(workdir / "prefect-server.log", "w") as out:
        server = subprocess.Popen([str(Path(sys.executable).parent / "prefect"), "server", "start", "--host", "127.0.0.1",
                                   "--port", str(port)], stdout=out, stderr=subprocess.STDOUT, env=env)
    PREFECT_API_URL = f"http://127.0.0.1:{port}/api"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{PREFECT_API_URL}/health", timeout=2):
                return server
        except OSError:
            time.sleep(0.5)
    server.kill()
    raise SystemExit(f"the Prefect server did not start; see {workdir / 'prefect-server.log'}")


def train_args(config_path: Path | None, folder: Path, run_id: str) -> list[str]:
    args = ["train"] + ([str(config_path)] if config_path else [])
    return args + ["--run-id", run_id, "--set", f'storage.lake_uri="{folder / "lake"}"',
                   "--set", f'tracking.mlflow_uri="sqlite:///{folder / "mlflow.db"}"']


def plan(config: RunConfig, files_per_checkpoint: int) -> dict[str, tuple[str, int]]:
    """moment -> (failpoint spec, kill step). Kills land after the first periodic checkpoint
    when the run has one, so the resume replays committed steps after it."""
    every, steps = config.checkpoint.every_steps, config.train.steps
    step = min(steps, every + 2) if every < steps else steps
    checkpoint_step = every if every <= steps else steps
    periodic_before = len(range(every, checkpoint_step, every)) if every <= steps else 0
    return {
        "generate": (f"generate@{step}", step),
        "verify": (f"verify@{step}", step),
        "update": (f"update@{step}", step),
        "part-write": (f"part-write@{step}", step),
        # 2nd file of that checkpoint: checkpoint 0 and earlier periodic ones come first
        "checkpoint-write": (f"checkpoint-write@{(1 + periodic_before) * files_per_checkpoint + 2}", checkpoint_step),
        "warmstart": ("checkpoint-write@2", 0),  # inside checkpoint 0: the resume redoes the warm-start
    }


def rows(lake: Lake, run_id: str) -> dict[tuple[int, str, int], tuple]:
    result = query_trajectories(lake, f"select step, task_id, sample_idx, completion_text, reward, advantage "
                                      f"from trajectories where run_id = '{run_id}'")
    return {(r[0], r[1], r[2]): tuple(r[3:]) for r in result.rows}


def final_weights(lake: Lake, run_id: str, step: int) -> dict[str, torch.Tensor]:
    folder = Path(tempfile.mkdtemp())
    lake.load_checkpoint(run_id, step, folder)
    return load_file(str(folder / "policy" / "model.safetensors"))


def mlflow_points(folder: Path, lake: Lake, run_id: str, key: str) -> list[tuple[int, float]]:
    info = lake.read_run_info(run_id)
    client = MlflowClient(tracking_uri=f"sqlite:///{folder / 'mlflow.db'}")
    return sorted((p.step, p.value) for p in client.get_metric_history(info.mlflow_run_id, key))


def compare(config: RunConfig, folder: Path, run_id: str, ref_folder: Path, ref_id: str) -> dict[str, bool]:
    lake, ref = Lake.open(str(folder / "lake")), Lake.open(str(ref_folder / "lake"))
    steps = config.train.steps
    expected_rows = steps * config.rollout.prompts_per_step * config.rollout.group_size
    count = query_trajectories(lake, "select count(*), count(distinct (run_id, step, task_id, sample_idx)) "
                                     f"from trajectories where run_id = '{run_id}'").rows[0]
    listed = {part.path for part in lake.committed_parts(run_id)}
    globbed = {str(p.relative_to(folder / "lake")) for p in (folder / "lake" / "trajectories").rglob("*.parquet")}
    ours, theirs = final_weights(lake, run_id, steps), final_weights(ref, ref_id, steps)
    return {
        "manifests": lake.committed_steps(run_id) == list(range(1, steps + 1)),
        "rows": tuple(count) == (expected_rows, expected_rows),
        "same rows": rows(lake, run_id) == rows(ref, ref_id),
        "no orphan": globbed == listed,
        "weights": sorted(ours) == sorted(theirs) and all(torch.equal(ours[k], theirs[k]) for k in theirs),
        "mlflow": all(mlflow_points(folder, lake, run_id, key) == mlflow_points(ref_folder, ref, ref_id, key)
                      and [s for s, _ in mlflow_points(folder, lake, run_id, key)] == list(range(1, steps + 1))
                      for key in ("reward/mean", "train/loss")),
    }


def run_moment(moment: str, spec: str, config_path: Path | None, config: RunConfig, workdir: Path, ref_id: str) -> Result:
    folder = workdir / moment
    folder.mkdir(parents=True, exist_ok=True)
    run_id, result, started = f"kill-{moment}", Result(moment, spec), time.monotonic()
    try:
        killed = run_cli(train_args(config_path, folder, run_id), folder, failpoints=spec)
        result.killed_rc = killed.returncode
        committed = Lake.open(str(folder / "lake")).committed_steps(run_id)
        result.committed_at_kill = f"{committed[0]}..{committed[-1]}" if committed else "-"
        resumed = run_cli(["resume", run_id, "--lake", str(folder / "lake")], folder)
        result.resume_rc = resumed.returncode
        if resumed.returncode != 0:
            result.error = resumed.stderr[-500:]
        else:
            result.checks = compare(config, folder, run_id, workdir / "reference", ref_id)
    except Exception as exc:  # noqa: BLE001 - reported in the table
        result.error = f"{type(exc).__name__}: {exc}"
    result.seconds = time.monotonic() - started
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", type=Path, default=REPO_ROOT / "configs" / "quickstart.toml")
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--parallel", type=int, default=2)
    parser.add_argument("--moments", default=",".join(MOMENTS))
    args = parser.parse_args()
    config_path = args.config.resolve() if args.config.is_file() else None  # the runs have their own cwd
    if config_path is None:
        print(f"{args.config} not found: using the built-in defaults")
    workdir = (args.workdir or Path(tempfile.mkdtemp(prefix="kill-resume-"))).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    config = load_config(config_path, [])
    print(f"workdir {workdir}; {config.train.steps} steps, checkpoints every {config.checkpoint.every_steps}")

    server = start_prefect_server(workdir)
    try:
        return compare_all(args, config_path, config, workdir)
    finally:
        server.terminate()
        server.wait(timeout=30)


def compare_all(args: argparse.Namespace, config_path: Path | None, config: RunConfig, workdir: Path) -> int:
    started = time.monotonic()
    (workdir / "reference").mkdir(exist_ok=True)
    reference = run_cli(train_args(config_path, workdir / "reference", "reference"), workdir / "reference")
    if reference.returncode != 0:
        print(reference.stderr[-3000:])
        return 1
    print(f"reference run: {time.monotonic() - started:.0f} s", flush=True)
    ckpt = json.loads(Lake.open(str(workdir / "reference" / "lake")).objects.get(
        f"checkpoints/reference/step={config.train.steps:06d}/CHECKPOINT.json"))
    moments = plan(config, len(ckpt["files"]))
    chosen = [m.strip() for m in args.moments.split(",") if m.strip()]
    with ThreadPoolExecutor(max_workers=max(1, args.parallel)) as pool:
        futures = {pool.submit(run_moment, m, moments[m][0], config_path, config, workdir, "reference"): m for m in chosen}
        for future in as_completed(futures):
            done = future.result()
            print(f"  {done.moment}: killed {done.killed_rc}, resumed {done.resume_rc}, {done.seconds:.0f} s", flush=True)
        results = [future.result() for future in futures]

    names = ("manifests", "rows", "same rows", "no orphan", "weights", "mlflow")
    header = f"{'moment':17s} {'failpoint':22s} {'killed':6s} {'committed':10s} {'resume':6s} " + " ".join(f"{n:9s}" for n in names) + "  seconds"
    print(header)
    print("-" * len(header))
    ok = True
    for r in results:
        checks = r.checks or {}
        marks = " ".join(f"{('ok' if checks.get(n) else 'FAIL') if checks else '-':9s}" for n in names)
        good = r.killed_rc == -9 and r.resume_rc == 0 and bool(checks) and all(checks.values())
        ok &= good
        print(f"{r.moment:17s} {r.failpoint:22s} {str(r.killed_rc):6s} {r.committed_at_kill:10s} {str(r.resume_rc):6s} {marks}  {r.seconds:7.0f}")
        if r.error:
            print(f"    error: {r.error.strip()[:500]}")
    print(f"{'all moments resumed to the uninterrupted result' if ok else 'SOME CHECKS FAILED'}; total {time.monotonic() - started:.0f} s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
