"""`rlpipe rescore RUN [--env E] [--json]`: re-verify a finished run's trajectories with the
current verifiers (controller/rescore.py does the work) and print what flipped, by domain.

Prints, per domain, the verifier versions then and now, the counts pass->fail and
fail->pass, and a few examples; the new table is queryable at once (`rlpipe query "select
* from rescores where flip is not null"`). A progress line on stderr follows long work.
Exit status: 0 when the rescore is committed (whether or not anything flipped), 2 for bad
input (no lake, unknown run, a run without trajectories, a domain the run does not have).

What it does not: change the run (its trajectories and rewards stay as they are).
"""

from __future__ import annotations

import json
from typing import Optional

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from rlpipe.cli.consoles import literal, stderr_console, stdout_console
from rlpipe.cli.sandbox import Backend

console = stdout_console()
progress_console = stderr_console()


def rescore(
    run_id: str = typer.Argument(..., help="The run whose committed trajectories are re-verified."),
    env: Optional[str] = typer.Option(None, "--env", help="Only this domain of the run (default: every domain)."),
    config: Optional[str] = typer.Option(None, "--config", help="Read the lake location from this config."),
    lake: Optional[str] = typer.Option(None, "--lake", help="Lake URI (folder or s3://bucket/prefix); default: from --config, else ./rlpipe-lake."),
    json_out: bool = typer.Option(False, "--json", help="Print the summary as one JSON object."),
    backend: Optional[Backend] = typer.Option(None, "--backend", help="Sandbox backend for code domains (default: the run's sandbox.backend)."),
    no_cache: bool = typer.Option(False, "--no-cache", help="Re-run every verdict, also those the current verifier version already gave."),
    examples: int = typer.Option(3, "--examples", min=0, help="Flipped verdicts shown per domain and direction."),
    batch_rows: int = typer.Option(4096, "--batch-rows", min=1, help="Rows read, verified and written at a time (bounds memory)."),
) -> None:
    """Re-verify a run's stored trajectories with the current verifiers; print what flipped, by domain."""
    from pathlib import Path

    from rlpipe.cli.lake import config_for_lake, open_lake
    from rlpipe.controller.rescore import rescore_run

    store = open_lake(config_for_lake(Path(config) if config else None, lake))
    with Progress(TextColumn("[bold]rescoring {task.fields[run]}"), BarColumn(), MofNCompleteColumn(), TextColumn("steps"),
                  TextColumn("{task.fields[detail]}"), TimeElapsedColumn(), console=progress_console, transient=True) as bar:
        task_id = bar.add_task("rescore", total=None, run=run_id, detail="")

        def show(where) -> None:
            bar.update(task_id, total=where.steps, completed=where.steps_done,
                       detail=f"{where.rows_done} rows, {where.verified} verified, {where.cached} cached")

        summary = rescore_run(store, run_id, env=env, backend=backend.value if backend else None, use_cache=not no_cache,
                              progress=show, examples=examples, batch_rows=batch_rows)
    if json_out:
        typer.echo(json.dumps(summary.to_dict()))
        return
    _print_summary(summary)


def _print_summary(summary) -> None:
    console.print(f"rescore [bold]{literal(summary.rescore_id)}[/] of run {literal(summary.run_id)}: {summary.rows} rows, "
                  f"{summary.verified} verified, {summary.cached} cached; [bold]{summary.flipped} flipped[/]")
    for domain in summary.domains:
        then = ", ".join(domain.stored_versions) or "-"
        console.print(f"  {literal(domain.domain)} (verifier {literal(then)} -> {literal(domain.current_version)}): "
                      f"{domain.rows} rows, pass->fail {domain.pass_to_fail}, fail->pass {domain.fail_to_pass}"
                      + (f", unscored {domain.unscored}" if domain.unscored else ""))
        for example in domain.examples:
            console.print(f"    {example.flip} step {example.step} {literal(example.task_id)} #{example.sample_idx} "
                          f"{literal(json.dumps(example.completion))}: {literal(example.old_reason)} -> {literal(example.reason)}"
                          + (f" ({literal(example.detail)})" if example.detail else ""))
    console.print(f"query it: rlpipe query --lake {literal(summary.lake_uri)} \"select * from rescores where "
                  f"rescore_id = '{literal(summary.rescore_id)}' and flip is not null\"")
