"""The lake a command works on: `config_for_lake` (a config file, --lake on top) and
`open_lake` (open it as it is, never create it; a missing lake is exit 2 naming it).

Shared by `rlpipe runs`, `query`, `resume`, `export` and `rescore`; only `train` creates a
lake (its pre-flight). Not here: anything a command does with the lake.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Optional

from rlpipe.core.config import RunConfig, load_config
from rlpipe.core.errors import LakeNotFoundError

if TYPE_CHECKING:
    from rlpipe.storage.lake import Lake


def open_lake(run_config: RunConfig) -> Lake:
    """The lake of `run_config` as it is: never created here (exit 2 when missing)."""
    from rlpipe.controller.builders import build_lake

    try:
        return build_lake(run_config, create=False)
    except LakeNotFoundError as exc:
        raise LakeNotFoundError(exc.message, "check --lake/--config (storage.lake_uri); `rlpipe train` creates a lake") from None


def config_for_lake(config: Optional[Path], lake: Optional[str]) -> RunConfig:
    """The config file `config` (defaults when None), with storage.lake_uri = `lake` if given."""
    run_config = load_config(config, [])
    if lake is not None:
        run_config = run_config.model_copy(update={"storage": run_config.storage.model_copy(update={"lake_uri": lake})})
    return run_config
