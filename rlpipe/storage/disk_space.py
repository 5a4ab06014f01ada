"""Whether a local lake's disk can hold what a run will keep: the pre-flight's disk check.

A run keeps at most `kept_checkpoints` checkpoints at once (storage/checkpoint_retention.py:
checkpoint.keep_last, +1 being written before the older ones are deleted, +1 the best by
held-out accuracy, +1 a pipelined run's restore target, +1 checkpoint 0 as the KL reference;
never more than the run makes), each of the size rl/checkpoint_size.py estimates, plus its
rows (rollout.prompts_per_step x group_size per step, ROW_BYTES_PER_TOKEN per generated token
plus ROW_BYTES of prompt and columns, before compression). `check_lake_disk` refuses a
local lake whose free space is less than that, minus what the run already holds there (a
resume): a ConfigError naming the folder, the need and the free space, raised before
anything is written. An S3 lake is not checked (its free space is not known).

What it does not: reserve space (another writer can still fill the disk: a full disk during
a save is DiskFull, storage/objects.py), or measure a run's rows exactly.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from rlpipe.core.errors import ConfigError

ROW_BYTES = 2048
ROW_BYTES_PER_TOKEN = 16


@dataclass(frozen=True)
class DiskNeed:
    checkpoint_bytes: int
    kept_checkpoints: int
    rows_bytes: int

    @property
    def total_bytes(self) -> int:
        return self.checkpoint_bytes * self.kept_checkpoints + self.rows_bytes


def kept_checkpoints(config) -> int:
    """The most checkpoints a run of `config` (a RunConfig) holds at once."""
    made = config.train.steps // config.checkpoint.every_steps + 2  # step 0, every N, the last
    if config.checkpoint.keep_last == 0:
        return made
    kept = config.checkpoint.keep_last + 1 + 1  # + the one being written + the best
    kept += 1 if config.rollout.max_staleness > 0 else 0
    kept += 1 if config.algo.kl_coef > 0 else 0
    return min(made, kept)


def disk_need(config, checkpoint_bytes: int) -> DiskNeed:
    rollout = config.rollout
    rows = config.train.steps * rollout.prompts_per_step * rollout.group_size
    return DiskNeed(checkpoint_bytes, kept_checkpoints(config), rows * (ROW_BYTES + ROW_BYTES_PER_TOKEN * rollout.max_new_tokens))


def check_lake_disk(config, checkpoint_bytes: int, run_id: str | None = None) -> DiskNeed:
    """ConfigError when the local lake's disk cannot hold what the run keeps (see the module
    docstring); the need otherwise. Creates nothing."""
    need = disk_need(config, checkpoint_bytes)
    uri = config.storage.lake_uri
    if "://" in uri and not uri.startswith("file://"):
        return need
    folder = Path(uri.removeprefix("file://")).expanduser().absolute()
    existing = folder
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    free = shutil.disk_usage(existing).free
    held = _run_bytes(folder, run_id) if run_id else 0
    if need.total_bytes - held > free:
        raise ConfigError(
            f"the lake {folder} needs about {_gb(need.total_bytes - held)} for this run but its disk has {_gb(free)} free "
            f"({need.kept_checkpoints} checkpoints of {_gb(need.checkpoint_bytes)} + {_gb(need.rows_bytes)} of rows)",
            "free space, put the lake on a larger disk (storage.lake_uri), or keep fewer checkpoints (checkpoint.keep_last)",
        )
    return need


def _run_bytes(folder: Path, run_id: str) -> int:
    """What a run already holds in the lake (a resume reuses it)."""
    total = 0
    for part in (folder / "checkpoints" / run_id, folder / "trajectories" / f"run_id={run_id}", folder / "set_apart" / f"run_id={run_id}"):
        if part.is_dir():
            total += sum(path.stat().st_size for path in part.rglob("*") if path.is_file())
    return total


def _gb(size: int) -> str:
    return f"{size / 1e9:.2f} GB" if size >= 1e7 else f"{size / 1e6:.1f} MB"
