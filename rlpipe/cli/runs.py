"""Read-only commands over the lake: `runs list`, `runs show` (`query`: cli/query_output.py).

`runs show` prints where the run is recorded (the MLflow run and the Prefect flow run, from
links.json, else the ids in run.json), its newest checkpoint with the command that exports it
as an HF folder (`export_command`), the checkpoints the run keeps (step, size, held-out
accuracy, why retention keeps each: storage/checkpoint_retention.py), its held-out
evaluations (before RL, every eval.every_steps, after RL: each domain's strict and
format-free accuracy with its binomial standard error), and, for a failed or
interrupted run, how to resume it (`resume_command`). A run whose status.json says running
but that no process holds (storage/run_lock.py: it was killed) is shown as stopped, with
its resume command."""

from __future__ import annotations

import json
import shlex
from typing import Any

from rich.console import Console
from rich.table import Table

from rlpipe.cli.query_output import format_value as _fmt
from rlpipe.core.config import config_from_dict
from rlpipe.core.errors import RunNotFoundError
from rlpipe.storage.checkpoint_retention import kept_checkpoints, rule_of
from rlpipe.storage.heldout_evaluations import read_heldout_evaluations
from rlpipe.storage.lake import Lake
from rlpipe.storage.run_lock import run_is_held

INTERRUPTED = "interrupted by "  # status.json's error for a signal (orchestration/status.py writes it)


def run_report(lake: Lake, run_id: str) -> dict[str, Any]:
    """Everything `runs show` prints, as plain JSON-able data."""
    info = lake.read_run_info(run_id)
    if info is None:
        raise RunNotFoundError(f"no run {run_id!r} in {lake.uri}", "list runs with `rlpipe runs list` (add --lake or --config for another lake)")
    status = lake.read_status(run_id)
    steps = lake.committed_steps(run_id)
    last = lake.read_manifest(run_id, steps[-1]) if steps else None
    config = config_from_dict(json.loads(info.config_json))
    before = lake.read_json(run_id, "evals/before_rl.json")
    after = lake.read_json(run_id, "evals/after_rl.json")
    if status is None:
        state = "unknown"
    elif status.state.value == "failed" and (status.error or "").startswith(INTERRUPTED):
        state = f"{status.error} at step {status.step} in stage {status.stage}"
    elif status.state.value == "failed":
        state = f"failed at step {status.step} in stage {status.stage}: {status.error}"
    elif status.state.value == "running" and not run_is_held(lake.location, run_id):
        state = (f"stopped at step {status.step} in stage {status.stage}: no process writes it (killed, or its machine "
                 "went down)")
    elif status.state.value == "running":
        state = f"running (step {status.step}, {status.stage})"
    else:
        state = "finished"
    return {
        "run_id": run_id,
        "state": status.state.value if status else "unknown",
        "state_detail": state,
        "failed_step": status.step if status and status.state.value == "failed" else None,
        "failed_stage": status.stage if status and status.state.value == "failed" else None,
        "error": status.error if status else None,
        "config": json.loads(info.config_json),
        "config_hash": info.config_hash,
        "mlflow_run_id": info.mlflow_run_id,
        "prefect_flow_run_id": info.prefect_flow_run_id,
        "steps_committed": len(steps),
        "rows_per_step": rows_per_step(lake, run_id, steps),
        "last_step": steps[-1] if steps else None,
        "last_step_metrics": dict(last.metrics) if last else {},
        "heldout_accuracy_before_rl": before.get("accuracy") if before else None,
        "heldout_accuracy_after_rl": after.get("accuracy") if after else None,
        "heldout_before_rl": before,
        "heldout_after_rl": after,
        "lake_uri": lake.uri,
        "resume_command": resume_command(run_id, lake.uri) if status and (status.state.value == "failed" or
                                                                          state.startswith("stopped")) else None,
        "links": lake.read_json(run_id, "links.json") or _links_of(info),
        "latest_checkpoint": lake.latest_checkpoint(run_id),
        "checkpoints": [dict(step=kept.step, size_bytes=kept.size_bytes, accuracy=kept.accuracy, kept_as=list(kept.reasons),
                             write_s=kept.write_s, write_cpu_s=kept.write_cpu_s)
                        for kept in kept_checkpoints(lake, run_id, rule_of(config))],
        "evaluations": [dict(name=evaluation.name, step=evaluation.policy_version,
                             domains=[dict(domain=score.domain, count=score.count, strict=score.strict,
                                           strict_error=score.strict_error, format_free=score.format_free,
                                           format_free_error=score.format_free_error) for score in evaluation.domains])
                        for evaluation in read_heldout_evaluations(lake, run_id, config.envs.heldout_size)],
        "export_command": export_command(run_id, lake.uri),
        "warmstart": lake.read_json(run_id, "progress/warmstart.json"),
    }


def rows_per_step(lake: Lake, run_id: str, steps: list[int]) -> list[dict[str, int]]:
    """Each committed step's rows: those it trained on (the trajectories folder, what any
    reader sees) and those dynamic sampling set apart (the `set_apart` view), from the
    manifests alone, so a run whose groups all lacked a signal does not look empty."""
    rows = []
    for step in steps:
        manifest = lake.read_manifest(run_id, step)
        rows.append({"step": step, "trained": sum(part.rows for part in manifest.parts),
                     "set_apart": sum(part.rows for part in manifest.set_apart)})
    return rows


def rows_line(per_step: list[dict[str, int]]) -> str:
    """One line: the rows trained on and set apart over the committed steps, and the last step's."""
    trained, set_apart = sum(row["trained"] for row in per_step), sum(row["set_apart"] for row in per_step)
    last = per_step[-1]
    return (f"rows: {trained} trained on, {set_apart} set apart by dynamic sampling (the set_apart view) over "
            f"{len(per_step)} steps; step {last['step']}: {last['trained']} trained on, {last['set_apart']} set apart")


def resume_command(run_id: str, lake_uri: str) -> str:
    """The command that resumes `run_id` from the lake (its config and MLflow store are in
    run.json; an S3 lake's endpoint and keys come from the environment or --config)."""
    return f"rlpipe resume {shlex.quote(run_id)} --lake {shlex.quote(lake_uri)}"


def export_command(run_id: str, lake_uri: str) -> str:
    """The command that writes the run's newest policy as a Hugging Face folder."""
    return f"rlpipe export {shlex.quote(run_id)} DIR --lake {shlex.quote(lake_uri)}"


def _links_of(info) -> dict[str, str | None] | None:
    """What run.json knows of the links (links.json is written when a flow run starts; a run
    from before it has none): the ids, without URLs; None when it has neither."""
    if not info.mlflow_run_id and not info.prefect_flow_run_id:
        return None
    tracking_uri = json.loads(info.config_json).get("tracking", {}).get("mlflow_uri") or "MLflow (the default store of where it ran)"
    return {"mlflow_run_id": info.mlflow_run_id, "mlflow_tracking_uri": tracking_uri, "mlflow_run_url": None,
            "prefect_flow_run_id": info.prefect_flow_run_id, "prefect_flow_run_url": None}


def print_runs(lake: Lake, json_out: bool, console: Console) -> None:
    rows = []
    for run_id in lake.list_runs():
        status = lake.read_status(run_id)
        state = status.state.value if status else "unknown"
        if state == "running" and not run_is_held(lake.location, run_id):
            state = "stopped"  # status.json says running, but no process holds the run: it was killed
        rows.append({"run_id": run_id, "state": state, "steps_committed": len(lake.committed_steps(run_id))})
    if json_out:
        print(json.dumps(rows, indent=2))
        return
    table = Table("run", "state", "steps committed", title=f"runs in {lake.uri}")
    for row in rows:
        table.add_row(row["run_id"], row["state"], str(row["steps_committed"]))
    console.print(table)


def print_run(lake: Lake, run_id: str, json_out: bool, console: Console) -> None:
    report = run_report(lake, run_id)
    if json_out:
        print(json.dumps(report, indent=2, default=str))
        return
    console.print(f"[bold]{run_id}[/]  {report['state_detail']}", markup=True, highlight=False)
    if report["resume_command"]:
        console.print(f"resume with: {report['resume_command']}", soft_wrap=True, markup=False)
    console.print(f"lake {report['lake_uri']}  mlflow run {report['mlflow_run_id']}  config {report['config_hash']}")
    if report["links"]:
        from rlpipe.cli.progress import link_lines

        for line in link_lines(report["links"]):  # the MLflow run and the Prefect flow run
            console.print(line, soft_wrap=True, markup=False)
    if report["latest_checkpoint"] is not None:
        console.print(f"policy at step {report['latest_checkpoint']} (newest checkpoint); export it: {report['export_command']}",
                      soft_wrap=True, markup=False)
    if report["checkpoints"]:
        kept = Table("checkpoint", "size", "held-out accuracy", "kept as", "written in", title="checkpoints kept")
        for checkpoint in report["checkpoints"]:
            written = (f"{checkpoint['write_s']:.1f} s ({checkpoint['write_cpu_s']:.1f} CPU s)"
                       if checkpoint["write_s"] is not None and checkpoint["write_cpu_s"] is not None else "-")
            kept.add_row(str(checkpoint["step"]), f"{checkpoint['size_bytes'] / 1e6:.1f} MB", _fmt(checkpoint["accuracy"]),
                         ", ".join(checkpoint["kept_as"]) or "-", written)
        console.print(kept)
    console.print(f"steps committed: {report['steps_committed']} of {report['config']['train']['steps']}")
    if report["rows_per_step"]:
        console.print(rows_line(report["rows_per_step"]), soft_wrap=True, markup=False, highlight=False)
    before, after = report["heldout_accuracy_before_rl"], report["heldout_accuracy_after_rl"]
    console.print(f"held-out accuracy: before RL {_fmt(before)}  after RL {_fmt(after)}")
    if report["evaluations"]:
        console.print(evaluations_table(report["evaluations"]))
    table = Table("metric", "value", title=f"step {report['last_step']}")
    for name, value in sorted(report["last_step_metrics"].items()):
        table.add_row(name, _fmt(value))
    console.print(table)


def evaluations_table(evaluations: list[dict[str, Any]]) -> Table:
    """One row per evaluation and domain: strict and format-free accuracy, each +- its
    binomial standard error (format-free "-" for a domain whose answers are not numbers)."""
    table = Table("evaluation", "step", "domain", "n", "strict", "format-free", title="held-out evaluations (accuracy ± standard error)")
    for evaluation in evaluations:
        for score in evaluation["domains"]:
            table.add_row(evaluation["name"], str(evaluation["step"]), score["domain"], str(score["count"]),
                          _with_error(score["strict"], score["strict_error"]),
                          _with_error(score["format_free"], score["format_free_error"]))
    return table


def _with_error(value: float | None, error: float | None) -> str:
    return "-" if value is None or error is None else f"{value:.3f} ± {error:.3f}"

