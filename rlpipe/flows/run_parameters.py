"""The train flow's parameters as a deployment receives them: a typed RunConfig (the Prefect
UI draws it as a form, from the pydantic schema), an optional TOML file on the worker, and
an optional run id. This module turns them into the (RunConfig, run id) a run needs.

The rule for a config given both ways (`config` and `config_path`):

- The file is the base. The form's values that differ from RunConfig's defaults go on top
  of it (a key is `section.field`, e.g. `train.steps`; a table-valued field such as
  `envs.domains` is one key). A form left at its defaults therefore means "the file as is".
- A key that the file sets and the form changes to another value is an error naming both
  values: nobody has to guess which one won. Setting a key back to its default from the
  form while the file changes it is not possible (the form cannot tell "default" from
  "unset"): edit the file, or clear config_path.

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

from rlpipe.core.config import RunConfig, config_from_dict, load_config, with_overrides
from rlpipe.core.errors import ConfigError

DEFAULT_RUN_PREFIX = "run"


def resolve_config(config: RunConfig, config_path: str | None) -> RunConfig:
    """The run's config from the form (`config`) and the file (`config_path`), by the rule
    of the module docstring; validated with the cross-table checks of core/config.py."""
    if not config_path:
        return with_overrides(config, [])  # the checks that span tables (pydantic checked each table)
    path = Path(config_path).expanduser().absolute()  # relative to where the flow runs: name it whole in errors
    from_file = load_config(path)
    changed = _changed_keys(config, RunConfig())
    conflicts = [
        f"{key} = {form_value!r} in the form but {_value_at(from_file, key)!r} in {path}"
        for key, form_value in changed.items()
        if key in _keys_in_file(path) and _value_at(from_file, key) != form_value
    ]
    if conflicts:
        raise ConfigError(
            "the run config disagrees with config_path: " + "; ".join(conflicts),
            "set each key in one place: change it in the file, or leave it at its default in the form (or clear config_path)",
        )
    data = from_file.model_dump(mode="json")
    for key, value in changed.items():
        section, _, field = key.partition(".")
        if field:
            data[section][field] = value
        else:
            data[section] = value
    merged = config_from_dict(data)
    keys = {name: getattr(config.storage, name) or getattr(from_file.storage, name) for name in ("s3_access_key", "s3_secret_key")}
    return merged.model_copy(update={"storage": merged.storage.model_copy(update=keys)})


def derive_run_id(flow_run_id: str | None, expected_start: datetime | None, config_path: str | None) -> str:
    """A run id for a flow run started without one (module docstring)."""
    prefix = Path(config_path).stem if config_path else DEFAULT_RUN_PREFIX
    when = (expected_start or datetime.now(timezone.utc)).astimezone(timezone.utc)
    suffix = (flow_run_id or "local").replace("-", "")[:8]
    return f"{prefix}-{when:%Y%m%d-%H%M%S}-{suffix}"


def _changed_keys(config: RunConfig, defaults: RunConfig) -> dict[str, Any]:
    """`section.field` (or a top-level field) -> the form's value, where it differs from the default."""
    changed: dict[str, Any] = {}
    for name in RunConfig.model_fields:
        value, default = getattr(config, name), getattr(defaults, name)
        if isinstance(value, BaseModel):
            for field in type(value).model_fields:
                if type(value).model_fields[field].exclude:
                    continue  # S3 keys: never dumped, carried over separately
                if getattr(value, field) != getattr(default, field):
                    changed[f"{name}.{field}"] = _plain(getattr(value, field))
        elif value != default:
            changed[name] = _plain(value)
    return changed


def _keys_in_file(path: Path) -> set[str]:
    import tomllib

    data = tomllib.loads(path.read_text())
    return {f"{name}.{field}" for name, table in data.items() if isinstance(table, dict) for field in table} | {
        name for name, value in data.items() if not isinstance(value, dict)}


def _value_at(config: RunConfig, key: str) -> Any:
    section, _, field = key.partition(".")
    value = getattr(config, section)
    return _plain(getattr(value, field) if field else value)


def _plain(value: Any) -> Any:
    """Models inside a field (envs.files.<name>) as JSON data, so values compare and print plainly."""
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    return value

