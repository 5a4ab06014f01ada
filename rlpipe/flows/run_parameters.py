"""The train flow's parameters as a deployment receives them: a typed RunConfig (the Prefect
UI draws it as a form, from the pydantic schema), an optional TOML file on the worker, and
an optional run id. This module turns them into the (RunConfig, run id) a run needs.

The rule for a config given both ways (`config` and `config_path`) is `--set`'s
(core/config.py `merge_config`, the one function both use):

- The file is the base. The form's values that differ from RunConfig's defaults are the
  changes, and each goes on top of the file as `--set section.field=value` would (a
  table-valued field such as `envs.domains` is one key, replaced whole). The form's values
  win: `config_path=configs/quickstart.toml` with `{"train": {"steps": 5}}` is the
  quickstart for 5 steps, as `rlpipe train configs/quickstart.toml --set train.steps=5` is.
- A form left at its defaults therefore means "the file as is". Setting a key back to its
  default from the form while the file changes it is not possible (the form cannot tell
  "default" from "unset"): edit the file, or clear config_path.

The served deployment's form names the quickstart's file in config_path (QUICKSTART_CONFIG,
flows/serve.py), so its Run button as drawn trains the quickstart, a run of minutes.

Run ids: an explicit `run_id` is used as is (one that exists in the lake resumes). An empty
one is derived from the flow run: `{file stem or "run"}-{expected start, UTC}-{flow run id[:8]}`,
so every scheduled flow run starts a run of its own, and a retry of the same flow run (same
id, same expected start time) resumes that run instead of starting another.

Not here: reading the lake, resuming (tasks/lifecycle.py), the CLI's own run ids (cli/main.py).
"""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from rlpipe.core.config import RunConfig, merge_config

DEFAULT_RUN_PREFIX = "run"
QUICKSTART_CONFIG = Path(__file__).resolve().parents[2] / "configs" / "quickstart.toml"
"""The quickstart's file in this checkout (the served form's default config_path), where the
package runs from a checkout or the image's /opt/rlpipe; absent from an installed wheel."""


def resolve_config(config: RunConfig, config_path: str | None) -> RunConfig:
    """The run's config from the form (`config`) and the file (`config_path`), by the rule
    of the module docstring; validated with the cross-table checks of core/config.py."""
    path = Path(config_path).expanduser().absolute() if config_path else None  # named whole in errors
    merged = merge_config(path, list(form_changes(config).items()))
    keys = {name: getattr(config.storage, name) or getattr(merged.storage, name) for name in ("s3_access_key", "s3_secret_key")}
    return merged.model_copy(update={"storage": merged.storage.model_copy(update=keys)})


def derive_run_id(flow_run_id: str | None, expected_start: datetime | None, config_path: str | None) -> str:
    """A run id for a flow run started without one (module docstring)."""
    prefix = Path(config_path).stem if config_path else DEFAULT_RUN_PREFIX
    when = (expected_start or datetime.now(timezone.utc)).astimezone(timezone.utc)
    suffix = (flow_run_id or "local").replace("-", "")[:8]
    return f"{prefix}-{when:%Y%m%d-%H%M%S}-{suffix}"


def form_changes(config: RunConfig) -> dict[str, Any]:
    """`section.field` (or a top-level field) -> the form's value as JSON data, where it
    differs from RunConfig's default: what `--set` would change."""
    defaults = RunConfig()
    as_json = config.model_dump(mode="json")  # S3 keys (exclude=True) are not in it: carried over separately
    changed: dict[str, Any] = {}
    for name in RunConfig.model_fields:
        value, default = getattr(config, name), getattr(defaults, name)
        if isinstance(value, BaseModel):
            for field in as_json[name]:
                if getattr(value, field) != getattr(default, field):
                    changed[f"{name}.{field}"] = as_json[name][field]
        elif value != default:
            changed[name] = as_json[name]
    return changed
