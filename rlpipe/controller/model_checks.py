"""Pre-flight checks that the configured model can serve the configured domains, run before
any flow run or lake write (`preflight` in controller/preflight.py calls them).

What it checks: a model folder's config.json has a buildable attention shape (hidden size,
heads, key/value heads, head size), a vocabulary that covers its tokenizer, and positions
for the longest prompt of the configured domains + rollout.max_new_tokens and for the
longest warm-start example (prompt + reference answer + <eos>); for the tiny model, the
positions (its shape is checked when the config loads, core/config.py). Every failure is a
ConfigError naming the field, the value and what to do.

What it does not: build the model or read weights (config.json and the tokenizer only), or
import torch or transformers for a folder with a tokenizer.json (read with `tokenizers`, what
a fast HF tokenizer wraps): a bad folder is refused in a second, not after torch's import.
Prompts are measured over every task a domain lists (`all_tasks`), the held-out set, the
warm-start's own draw and a seeded sample of training tasks: generated domains (arithmetic,
reverse) reach their longest prompt within such a sample.
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer

from rlpipe.core.config import RunConfig, check_attention_shape
from rlpipe.core.errors import ConfigError, ModelNotFoundError
from rlpipe.core.records import Task
from rlpipe.core.seeds import derive_seed
from rlpipe.envs.mixture import Mixture
from rlpipe.rl.model_folder import FOLDER_HINT, check_model_folder

TRAIN_SAMPLE = 2000  # training tasks drawn beyond the warm-start's draw to find the longest prompt


def check_folder_model(config: RunConfig, mixture: Mixture) -> None:
    """A model folder (`model.path`): shape, vocabulary and positions from its config.json."""
    folder = check_model_folder(config.model.path)
    where = f"{folder / 'config.json'}"
    model_config = _read_json(folder / "config.json")
    heads = _int_field(model_config, "num_attention_heads", where)
    if heads is not None and (hidden := _int_field(model_config, "hidden_size", where)) is not None:
        kv_heads = _int_field(model_config, "num_key_value_heads", where)
        head_dim = _int_field(model_config, "head_dim", where)
        check_attention_shape(hidden, heads, heads if kv_heads is None else kv_heads, head_dim, {
            key: f"{key} in {where}" for key in ("hidden_size", "head_dim")
        } | {"num_heads": f"num_attention_heads in {where}", "num_kv_heads": f"num_key_value_heads in {where}"})
    tokenizer = _folder_tokenizer(folder)
    tokens = tokenizer.get_vocab_size(with_added_tokens=True) if isinstance(tokenizer, Tokenizer) else len(tokenizer)
    vocab_size = _int_field(model_config, "vocab_size", where)
    if vocab_size is not None and vocab_size < tokens:
        raise ConfigError(
            f"vocab_size={vocab_size} in {where} is smaller than its tokenizer ({tokens} tokens): "
            f"token ids {vocab_size}..{tokens - 1} have no embedding",
            "save the model with the tokenizer it was trained with, or resize it first "
            "(model.resize_token_embeddings(len(tokenizer)), then save_pretrained)",
        )
    positions = _int_field(model_config, "max_position_embeddings", where)
    if positions is not None:
        check_positions(config, mixture, tokenizer, positions, f"max_position_embeddings in {where}",
                        "use a model with more positions")


def _folder_tokenizer(folder: Path):
    """The folder's tokenizer.json through `tokenizers`: for a folder as save_pretrained writes
    it (tokenizer.json beside tokenizer_config.json) the same vocabulary, added tokens and
    encoding as the fast HF tokenizer the workers load. Any other folder (a slow tokenizer's
    files; a bare tokenizer.json, to which transformers adds tokens of its own) goes through
    transformers."""
    path = folder / "tokenizer.json"
    if not (path.is_file() and (folder / "tokenizer_config.json").is_file()):
        from rlpipe.rl.policy import load_local_tokenizer  # torch and transformers: slow tokenizers only

        return load_local_tokenizer(folder)
    try:
        return Tokenizer.from_file(str(path))
    except Exception as exc:  # noqa: BLE001 - tokenizers raises plain Exception on a bad file
        raise ModelNotFoundError(f"cannot load the tokenizer in {folder}: {exc}", FOLDER_HINT) from exc


def check_gguf_model(config: RunConfig, mixture: Mixture) -> None:
    """A GGUF file (`model.gguf`): the file itself (exists, GGUF, a loadable architecture); once
    converted (rl/pretrained.py), its HF folder as `check_folder_model` checks a folder. The
    conversion happens here, once, before any worker starts: the two workers would otherwise
    both convert, and the vLLM venv's engine worker cannot read GGUF at all. It converts in a
    child process (rl/gguf_folder.py): the controller never imports torch or transformers."""
    from rlpipe.rl.gguf_folder import converted_folder_in_child

    folder = converted_folder_in_child(config.model.gguf)
    check_folder_model(config.model_copy(update={"model": config.model.model_copy(update={"path": str(folder)})}), mixture)


def check_positions(config: RunConfig, mixture: Mixture, tokenizer, positions: int, field: str, remedy: str) -> None:
    """ConfigError when the longest prompt + rollout.max_new_tokens, or the longest
    warm-start example, needs more than `positions` tokens (`field` names where it is set)."""
    max_new = config.rollout.max_new_tokens
    prompt_tokens, task = _longest(tokenizer, _candidate_tasks(config, mixture), lambda t: t.prompt)
    if prompt_tokens + max_new > positions:
        raise ConfigError(
            f"the longest prompt of the configured domains ({task.task_id!r}: {prompt_tokens} tokens) + "
            f"rollout.max_new_tokens={max_new} = {prompt_tokens + max_new} tokens, more than {field}={positions}",
            f"{remedy} (at least {prompt_tokens + max_new}), or lower rollout.max_new_tokens, or drop the domain",
        )
    if config.warmstart.steps == 0:
        return
    examples = [t for t in _warm_start_tasks(config, mixture) if t.reference_answer is not None]
    if not examples:
        return
    example_tokens, task = _longest(tokenizer, examples, lambda t: t.prompt + t.reference_answer)
    if example_tokens + 1 > positions:  # + <eos>, which ends every warm-start answer
        raise ConfigError(
            f"the longest warm-start example ({task.task_id!r}: prompt + reference answer + <eos> = "
            f"{example_tokens + 1} tokens) is longer than {field}={positions}",
            f"{remedy} (at least {example_tokens + 1}), or skip the warm-start with warmstart.steps=0",
        )


def _warm_start_tasks(config: RunConfig, mixture: Mixture) -> list[Task]:
    """The warm-start's own draw (tasks/lifecycle.py `warm_start`)."""
    return mixture.sample(config.envs.train_size, rng_seed=derive_seed(config.seed, 0, "warmstart"))


def _candidate_tasks(config: RunConfig, mixture: Mixture) -> list[Task]:
    tasks = mixture.heldout(config.envs.heldout_size, seed=config.envs.heldout_seed) + _warm_start_tasks(config, mixture)
    tasks += mixture.sample(TRAIN_SAMPLE, rng_seed=derive_seed(config.seed, 0, "preflight"))
    for env in mixture.envs.values():
        listed = getattr(env, "all_tasks", None)
        if callable(listed):
            tasks += listed()
    return tasks


def _longest(tokenizer, tasks: list[Task], text) -> tuple[int, Task]:
    """(tokens, task) of the task whose `text(task)` encodes to the most tokens. `tokenizer`
    is a transformers tokenizer, or a `tokenizers.Tokenizer` (the tiny model's backend)."""
    unique = list({text(task): task for task in tasks}.items())
    texts = [item for item, _ in unique]
    if isinstance(tokenizer, Tokenizer):
        counts = [len(encoding.ids) for encoding in tokenizer.encode_batch(texts, add_special_tokens=False)]
    else:
        counts = [len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]
    index = max(range(len(unique)), key=lambda i: counts[i])
    return counts[index], unique[index][1]


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ModelNotFoundError(f"cannot read {path}: {exc}", "pass a folder written by model.save_pretrained()") from exc
    if not isinstance(data, dict):
        raise ModelNotFoundError(f"{path} is not a JSON object", "pass a folder written by model.save_pretrained()")
    return data


def _int_field(model_config: dict, key: str, where: str) -> int | None:
    value = model_config.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(f"{key}={value!r} in {where} is not a positive whole number", f"fix {key} in that file")
    return value
