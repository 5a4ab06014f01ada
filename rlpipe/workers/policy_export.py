"""Export a run's policy from its lake as a Hugging Face model folder: what `rlpipe export`
writes, and what the end of a train run logs to MLflow (orchestration/track.py).

A checkpoint's step folder already is that folder (rl/checkpoint_layout.py: config.json,
generation_config.json, the weights as safetensors, the tokenizer files; for a LoRA run the
merged weights, base + adapter, so it loads without peft), with the trainer's state beside
it; a checkpoint of the older layout has it in policy/. Exporting is therefore a checked
copy, and loads no model: the model files CHECKPOINT.json lists are downloaded with their
digests checked into a fresh folder beside the destination, which is then renamed into
place, so a failed export leaves no half-written folder. The optimizer state, the meta and
the adapter are not copied.

Which checkpoint: the step asked for (an error naming the steps that have one when it has
none); with `best`, the checkpoint with the highest held-out accuracy among those an
evaluation scored (storage/checkpoint_retention.py `best_step`); else the newest complete one whose files are intact (a newer one that lost or changed
files is passed over, and the result says so). Works on any lake (a folder or s3://).

Not here: training or merging (the trainer merged the adapter when it saved), printing
(cli/export.py), MLflow (orchestration/track.py).
"""

from __future__ import annotations

import dataclasses
import os
import secrets
import shutil
from dataclasses import dataclass
from pathlib import Path

from rlpipe.core.errors import LakeCorrupted, RunNotFoundError, UserError
from rlpipe.rl.checkpoint_layout import layout_of
from rlpipe.storage.checkpoint_retention import best_step, evaluated_accuracies
from rlpipe.storage.lake import Lake


@dataclass(frozen=True)
class ExportedPolicy:
    """Where the policy of `run_id` at checkpoint `step` was written, and what was skipped."""

    run_id: str
    step: int
    lake_uri: str
    folder: Path
    files: tuple[str, ...]  # relative to `folder`, sorted
    size_bytes: int
    passed_over: tuple[str, ...]  # one line per newer checkpoint that was not intact


def export_policy(lake: Lake, run_id: str, destination: Path, step: int | None = None, best: bool = False) -> ExportedPolicy:
    """Write the policy of `run_id` at checkpoint `step` (default: the newest intact one) as
    an HF folder at `destination` (made if missing; refused when it exists and is not an
    empty folder). UserError for an unknown run, a run without checkpoints, a step without
    one; LakeCorrupted when the checkpoint asked for (or every one) lost or changed files."""
    destination = Path(destination).expanduser().absolute()
    if lake.read_run_info(run_id) is None:
        raise RunNotFoundError(f"no run {run_id!r} in {lake.uri}",
                               "list runs with `rlpipe runs list --lake URI`, or point --lake/--config at the lake that holds it")
    _refuse_destination(destination)
    steps = lake.checkpoint_steps(run_id)
    if not steps:
        raise UserError(f"run {run_id!r} in {lake.uri} has no checkpoint yet",
                        "a run saves its first checkpoint after the warm start; export once it has one")
    if best:
        step = best_step(steps, evaluated_accuracies(lake, run_id))
        if step is None:
            raise UserError(f"no checkpoint of run {run_id!r} has a held-out evaluation",
                            "evaluations score the steps a checkpoint is saved at (before and after RL, and every "
                            "eval.every_steps); export the newest (leave --best out) or pass --step")
    if step is not None and step not in steps:
        raise UserError(f"run {run_id!r} has no checkpoint at step {step}",
                        f"checkpoints exist at steps {', '.join(map(str, steps))}; pass one of them to --step, "
                        f"or leave --step out for the newest ({steps[-1]})")
    candidates = [step] if step is not None else sorted(steps, reverse=True)
    destination.parent.mkdir(parents=True, exist_ok=True)
    staging = destination.parent / f".{destination.name}.export-{secrets.token_hex(4)}"
    passed_over: list[str] = []
    try:
        for candidate in candidates:
            shutil.rmtree(staging, ignore_errors=True)
            staging.mkdir()
            info = lake.checkpoints.info(run_id, candidate)
            layout = layout_of(file.path for file in info.files) if info else layout_of(())
            try:
                lake.load_checkpoint(run_id, candidate, staging / "download", only=layout.is_policy_file)
            except LakeCorrupted as exc:
                if candidate == candidates[-1]:
                    raise
                passed_over.append(f"checkpoint at step {candidate} passed over: {exc.message}")
                continue
            exported = _place(staging / "download" / layout.policy_dir, destination, run_id, candidate, lake.uri)
            return dataclasses.replace(exported, passed_over=tuple(passed_over))
        raise AssertionError("unreachable: the last candidate returns or raises")
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _refuse_destination(destination: Path) -> None:
    if destination.is_dir() and any(destination.iterdir()):
        raise UserError(f"export folder {destination} exists and is not empty",
                        "pass a new or empty folder (the export never mixes its files with others)")
    if destination.exists() and not destination.is_dir():
        raise UserError(f"export folder {destination} exists and is not a folder", "pass a new or empty folder")


def _place(policy: Path, destination: Path, run_id: str, step: int, lake_uri: str) -> ExportedPolicy:
    """Move the downloaded policy/ folder to `destination` (an empty one is replaced)."""
    files = sorted(path.relative_to(policy).as_posix() for path in policy.rglob("*") if path.is_file())
    if "config.json" not in files or not any(name.endswith(".safetensors") for name in files):
        raise LakeCorrupted(f"checkpoint at step {step} of run {run_id!r} in {lake_uri} holds no HF model "
                            f"(files: {', '.join(files) or 'none'})",
                            "it was not written by rlpipe's trainer; export another step (--step)")
    if destination.is_dir():
        destination.rmdir()  # empty (checked before): the rename needs the name free
    os.replace(policy, destination)
    size_bytes = sum((destination / name).stat().st_size for name in files)
    return ExportedPolicy(run_id, step, lake_uri, destination, tuple(files), size_bytes, ())
