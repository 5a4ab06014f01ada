"""Export a run's policy from its lake as a Hugging Face model folder: what `rlpipe export`
writes, and what the end of a train run logs to MLflow (tasks/track.py).

A checkpoint's policy/ sub-folder already is that folder (rl/checkpoint.py: config.json,
generation_config.json, the weights as safetensors, the tokenizer files; for a LoRA run the
merged weights, base + adapter, so it loads without peft). Exporting is therefore a checked
copy, and loads no model: the files CHECKPOINT.json lists under policy/ are downloaded with
their digests checked into a fresh folder beside the destination, which is then renamed into
place, so a failed export leaves no half-written folder. The optimizer state and the adapter
(trainer/) are not copied.

Which checkpoint: the step asked for (an error naming the steps that have one when it has
none); else the newest complete one whose files are intact (a newer one that lost or changed
files is passed over, and the result says so). Works on any lake (a folder or s3://).

Not here: training or merging (the trainer merged the adapter when it saved), printing
(cli/export.py), MLflow (tasks/track.py).
"""

from __future__ import annotations

import dataclasses
import os
import secrets
import shutil
from dataclasses import dataclass
from pathlib import Path

from rlpipe.core.errors import LakeCorrupted, RunNotFoundError, UserError
from rlpipe.rl.checkpoint_layout import POLICY_DIR
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


def export_policy(lake: Lake, run_id: str, destination: Path, step: int | None = None) -> ExportedPolicy:
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
            try:
                lake.load_checkpoint(run_id, candidate, staging, under=POLICY_DIR)
            except LakeCorrupted as exc:
                if candidate == candidates[-1]:
                    raise
                passed_over.append(f"checkpoint at step {candidate} passed over: {exc.message}")
                continue
            exported = _place(staging / POLICY_DIR, destination, run_id, candidate, lake.uri)
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
        raise LakeCorrupted(f"checkpoint at step {step} of run {run_id!r} in {lake_uri} holds no HF model in {POLICY_DIR}/ "
                            f"(files: {', '.join(files) or 'none'})",
                            "it was not written by rlpipe's trainer; export another step (--step)")
    if destination.is_dir():
        destination.rmdir()  # empty (checked before): the rename needs the name free
    os.replace(policy, destination)
    size_bytes = sum((destination / name).stat().st_size for name in files)
    return ExportedPolicy(run_id, step, lake_uri, destination, tuple(files), size_bytes, ())
