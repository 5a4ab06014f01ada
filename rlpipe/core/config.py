"""The run configuration: one frozen pydantic model of the tables in core/config_sections.py,
loaded from a sparse TOML file plus `--set a.b=c` overrides; its hash (what a resume may
change) and the checks that span tables.

The one merge rule (`merge_config`), for the CLI's `--set` and the Prefect form alike: the
file (or none) is the base, each change `section.key = value` replaces that key there (a
table-valued key such as `envs.domains` whole; the last change of a key wins), then the
whole is validated. The form's changes are its values that differ from the defaults
(flows/run_parameters.py).

Unknown keys and bad values are rejected with a ConfigError that names the field path and
says what to do. Library code never sees RunConfig: builders in controller/ (launch.py, sample.py) turn its
sections into flat constructor arguments. Units are in field names (timeout_s, memory_mb).
"""

from __future__ import annotations

import difflib
import hashlib
import json
import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from rlpipe.core.config_operations import (
    CheckpointConfig, ClusterConfig, QaConfig, SandboxConfig, StorageConfig, TrackingConfig,
)
from rlpipe.core.config_sections import (
    AlgoConfig, CurriculumConfig, EnvConfig, EvalConfig, FileDomainConfig, ModelConfig, ReasoningGymDomainConfig,
    RolloutConfig, TrainConfig, WarmstartConfig, Section,
)
from rlpipe.core.errors import ConfigError

__all__ = [
    "AlgoConfig", "CheckpointConfig", "ClusterConfig", "CurriculumConfig", "EnvConfig", "EvalConfig", "FileDomainConfig",
    "ModelConfig", "QaConfig", "ReasoningGymDomainConfig", "RolloutConfig", "RunConfig", "SandboxConfig", "StorageConfig",
    "TrackingConfig", "TrainConfig", "WarmstartConfig", "check_attention_shape", "config_changes", "config_from_dict",
    "hash_excluded", "hash_excluded_keys", "load_config", "merge_config", "parse_override", "with_overrides",
]


_HASH_EXCLUDED: dict[str, Any] = {
    "storage": True, "tracking": True, "eval": True, "checkpoint": True, "qa": True, "cluster": True,
    "train": {"steps", "logprob_chunk_positions"}, "sandbox": {"pool_size"}, "rollout": {"engine_python"},
}


def hash_excluded(key: str) -> bool:
    """Whether `section.key` is left out of the config hash: a resumed run may change it."""
    section, _, leaf = key.partition(".")
    rule = _HASH_EXCLUDED.get(section)
    return rule is True or (isinstance(rule, set) and leaf in rule)


def hash_excluded_keys() -> str:
    """The keys a resumed run may change, as a reader names them: "train.steps, ..., storage.*"."""
    leaves = [f"{section}.{leaf}" for section, rule in _HASH_EXCLUDED.items() if isinstance(rule, set) for leaf in sorted(rule)]
    return ", ".join(leaves + [f"{section}.*" for section, rule in _HASH_EXCLUDED.items() if rule is True])


class RunConfig(Section):
    seed: int = 0
    """Seed of the run; each step's seed is derived from (seed, step)."""
    model: ModelConfig = ModelConfig()
    envs: EnvConfig = EnvConfig()
    rollout: RolloutConfig = RolloutConfig()
    algo: AlgoConfig = AlgoConfig()
    train: TrainConfig = TrainConfig()
    warmstart: WarmstartConfig = WarmstartConfig()
    eval: EvalConfig = EvalConfig()
    curriculum: CurriculumConfig = CurriculumConfig()
    storage: StorageConfig = StorageConfig()
    tracking: TrackingConfig = TrackingConfig()
    checkpoint: CheckpointConfig = CheckpointConfig()
    sandbox: SandboxConfig = SandboxConfig()
    qa: QaConfig = QaConfig()
    cluster: ClusterConfig = ClusterConfig()

    def config_hash(self) -> str:
        """Hash of everything that changes what a run computes: not where it is stored or
        tracked, how long it runs, how often it checkpoints and evaluates, how many positions'
        logits the update holds at once (the same values up to rounding), or whether the
        quality gate ran before it (so a run can
        be resumed with more steps: see `hash_excluded`)."""
        data = self.model_dump(mode="json", exclude=_HASH_EXCLUDED)
        if not self.curriculum.enabled:  # runs from before [curriculum] existed keep their hash
            data.pop("curriculum")
        if self.warmstart.target_scope == "overall":  # nor do runs from before warmstart.target_scope
            data["warmstart"].pop("target_scope")
        if self.algo.clip_eps_high is None:  # nor do runs from before algo.clip_eps_high
            data["algo"].pop("clip_eps_high")
        return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]

    def flat(self) -> dict[str, str]:
        """The config as `section.key -> str`, for MLflow params."""
        return {key: str(value) for key, value in _flatten(self.model_dump(mode="json")).items()}


def config_changes(old: RunConfig, new: RunConfig) -> list[tuple[str, str | None, str | None]]:
    """(`section.key`, old value, new value) of every key whose value differs, sorted."""
    before, after = old.flat(), new.flat()
    return [(key, before.get(key), after.get(key)) for key in sorted(set(before) | set(after)) if before.get(key) != after.get(key)]


def with_overrides(config: RunConfig, overrides: list[str]) -> RunConfig:
    """`config` with `a.b=c` overrides applied, validated (S3 keys, never dumped, are kept)."""
    data = config.model_dump(mode="json")
    for override in overrides:
        _set_key(data, *parse_override(override))
    updated = config_from_dict(data)
    keys = {"s3_access_key": config.storage.s3_access_key, "s3_secret_key": config.storage.s3_secret_key}
    return updated.model_copy(update={"storage": updated.storage.model_copy(update=keys)})


def load_config(path: str | Path | None, overrides: Sequence[str] = ()) -> RunConfig:
    """Read a sparse TOML file (or none), apply `a.b=c` overrides (`--set`), validate."""
    return merge_config(path, [parse_override(override) for override in overrides])


def merge_config(path: str | Path | None, changes: Sequence[tuple[str, Any]]) -> RunConfig:
    """The run config of a sparse TOML file (or none) with `changes` on top: each
    (`section.key`, value) replaces that key in the file's data, the last one of a key
    winning; then validated. The one rule of `--set` and of the Prefect form."""
    data: dict[str, Any] = {}
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"config file not found: {path}", "pass the path of a TOML file, e.g. configs/quickstart.toml")
        try:
            data = tomllib.loads(path.read_text())
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{path} is not valid TOML: {exc}", "fix the syntax at that line") from exc
    for key, value in changes:
        _set_key(data, key, value)
    return config_from_dict(data)


def config_from_dict(data: dict[str, Any]) -> RunConfig:
    try:
        config = RunConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(*_explain(exc)) from exc
    for table in ("reasoning_gym", "files"):  # engines render every prompt with model.prompt_format
        for name, spec in getattr(config.envs, table).items():
            if spec.prompt_format not in (None, config.model.prompt_format):
                raise ConfigError(
                    f"envs.{table}.{name}.prompt_format = {spec.prompt_format!r}, but model.prompt_format = {config.model.prompt_format!r}",
                    "one run renders all prompts one way for now: make them equal (or drop the domain's prompt_format)")
    _check_curriculum(config)
    if config.model.path is None:  # a model folder's own config.json: controller/model_checks.py, before a run
        model = config.model
        check_attention_shape(model.hidden_size, model.num_heads, model.num_heads, None,
                              {"hidden_size": "model.hidden_size", "num_heads": "model.num_heads"})
    return config


def _check_curriculum(config: RunConfig) -> None:
    low, high = config.curriculum.band
    if not 0.0 <= low < high <= 1.0:
        raise ConfigError(f"curriculum.band = [{low}, {high}]: need 0 <= low < high <= 1", "e.g. band = [0.2, 0.8]")
    active = sum(1 for ratio in config.envs.domains.values() if ratio > 0)
    if config.curriculum.enabled and active * config.curriculum.min_ratio > 1.0:
        raise ConfigError(f"curriculum.min_ratio = {config.curriculum.min_ratio} x {active} domains is more than 1",
                          f"set curriculum.min_ratio <= {1.0 / active:.4g}")


def check_attention_shape(hidden_size: int, num_heads: int, num_kv_heads: int, head_dim: int | None,
                          names: dict[str, str]) -> None:
    """ConfigError unless the attention shape can be built: hidden_size splits into num_heads
    heads (unless head_dim is given), the head size is even (rotary embeddings rotate pairs
    of dimensions), and num_heads splits into groups of num_kv_heads. `names` maps each
    quantity to the field that sets it, for the message."""
    def name(key: str) -> str:
        return names.get(key, key)

    if head_dim is None:
        if hidden_size % num_heads:
            step = 2 * num_heads  # whole heads of an even size: the next check wants both
            below, above = hidden_size - hidden_size % step, hidden_size - hidden_size % step + step
            raise ConfigError(
                f"{name('hidden_size')}={hidden_size} does not split into {name('num_heads')}={num_heads} attention heads "
                f"({hidden_size} / {num_heads} is not a whole number)",
                f"make {name('hidden_size')} a multiple of {num_heads} (e.g. {' or '.join(str(n) for n in (below, above) if n)}) "
                f"or change {name('num_heads')}",
            )
        head_dim = hidden_size // num_heads
    if head_dim % 2:
        raise ConfigError(
            f"the attention head size is odd: {name('hidden_size')}={hidden_size} / {name('num_heads')}={num_heads} = {head_dim}"
            if "head_dim" not in names else f"{name('head_dim')}={head_dim} is odd",
            "rotary position embeddings need an even head size: pick hidden_size / num_heads even, "
            f"e.g. {name('hidden_size')}={2 * num_heads * max(1, (head_dim + 1) // 2)}",
        )
    if num_kv_heads <= 0 or num_heads % num_kv_heads:
        raise ConfigError(
            f"{name('num_kv_heads')}={num_kv_heads} does not divide {name('num_heads')}={num_heads}",
            "grouped-query attention shares each key/value head among num_heads / num_kv_heads query heads: "
            "use a divisor of num_heads (num_heads itself for plain multi-head attention)",
        )


def parse_override(override: str) -> tuple[str, Any]:
    """`section.key=value` -> (`section.key`, value): the value read as TOML, a bare word as a string."""
    key, sep, raw = override.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"bad override {override!r}", "write it as section.key=value, e.g. --set train.steps=5")
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw  # a bare word: take it as a string
    return key.strip(), value


def _set_key(data: dict[str, Any], key: str, value: Any) -> None:
    *parents, leaf = key.split(".")
    node = data
    for part in parents:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ConfigError(f"bad override {key}={value!r}: {part} is not a section", "override a leaf key")
    node[leaf] = value


def _explain(exc: ValidationError) -> tuple[str, str]:
    error = exc.errors()[0]
    where = ".".join(str(part) for part in error["loc"])
    if error["type"] == "extra_forbidden":
        known = _known_keys(error["loc"][:-1])
        close = difflib.get_close_matches(str(error["loc"][-1]), known, n=1)
        hint = f"did you mean {close[0]!r}?" if close else f"known keys here: {', '.join(sorted(known))}"
        return f"unknown config key {where!r}", hint
    return (
        f"bad value for {where!r}: {error['msg']} (got {error.get('input')!r})",
        "see the field's docstring in rlpipe/core/config_sections.py for its meaning and range",
    )


def _known_keys(parent_loc: tuple[Any, ...]) -> list[str]:
    model: type[BaseModel] = RunConfig
    for part in parent_loc:
        annotation = model.model_fields[str(part)].annotation
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            return []
        model = annotation
    return list(model.model_fields)


def _flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and key != "domains":
            flat.update(_flatten(value, f"{name}."))
        else:
            flat[name] = value
    return flat
