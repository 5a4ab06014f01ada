"""Every inconsistency a model config can have is exit 2 before anything starts: no flow run,
no traceback, no lake. Runs the real `rlpipe train` with a tiny model's settings, or with a
model folder whose config.json or tokenizer disagrees with itself or with the domains."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlpipe.rl.policy import build_char_tokenizer, build_tiny_model
from tests.cli.cli_process import error_lines, run_rlpipe

# arithmetic with max_operand 99: the longest prompt is "99+99=" (6 characters = 6 tokens of the
# char tokenizer), the longest warm-start example "99+99=198" + <eos> (10 tokens)
ARITHMETIC = ["--set", "envs.domains={arithmetic = 1.0}", "--set", "warmstart.steps=5"]

TINY_CASES = {
    "hidden size not a multiple of heads": (
        ["--set", "model.hidden_size=130", "--set", "model.num_heads=4"],
        ["model.hidden_size=130", "model.num_heads=4", "128 or 136"],  # 132 / 4 = 33: an odd head, refused next
    ),
    "odd head size": (
        ["--set", "model.hidden_size=12", "--set", "model.num_heads=4"],  # 12 / 4 = 3
        ["model.hidden_size=12", "= 3", "even"],
    ),
    "prompt + max_new_tokens past the positions": (
        [*ARITHMETIC, "--set", "model.max_position_embeddings=12", "--set", "rollout.max_new_tokens=8"],  # 6 + 8 = 14 > 12
        ["model.max_position_embeddings=12", "rollout.max_new_tokens=8", "14 tokens", "at least 14"],
    ),
    "warm-start example past the positions": (
        [*ARITHMETIC, "--set", "model.max_position_embeddings=9", "--set", "rollout.max_new_tokens=2"],  # 6 + 2 fits; 10 > 9
        ["warm-start example", "10 tokens", "model.max_position_embeddings=9", "warmstart.steps=0"],
    ),
}


def assert_refused_before_anything(result, lake: Path, must_mention: list[str]) -> None:
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    error, hint = error_lines(result)
    for text in must_mention:
        assert text in error + "\n" + hint, (text, result.stderr)
    assert not lake.exists()  # pre-flight opens (creates) the lake only once the input is good


@pytest.mark.parametrize("case", sorted(TINY_CASES))
def test_a_tiny_model_that_cannot_serve_the_run_is_refused(tmp_path: Path, case: str) -> None:
    overrides, must_mention = TINY_CASES[case]
    lake = tmp_path / "lake"
    result = run_rlpipe(["train", *overrides, "--set", f'storage.lake_uri="{lake}"'], tmp_path)
    assert_refused_before_anything(result, lake, must_mention)


def save_model_folder(folder: Path, config_changes: dict[str, int]) -> Path:
    """A model folder as save_pretrained writes it (weights of the vocab_size asked for, if
    any), then config.json edited by `config_changes`."""
    tokenizer = build_char_tokenizer()
    model = build_tiny_model("qwen2", config_changes.get("vocab_size", len(tokenizer)), hidden_size=32, num_layers=1, num_heads=4,
                             intermediate_size=64, max_position_embeddings=64, seed=0)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    config_path = folder / "config.json"
    config_path.write_text(json.dumps(json.loads(config_path.read_text()) | config_changes))
    return folder


FOLDER_CASES = {
    "key/value heads that do not divide the heads": (
        dict(num_key_value_heads=3), ["num_key_value_heads in", "=3", "num_attention_heads in", "=4"],
    ),
    "vocabulary smaller than the tokenizer": (
        dict(vocab_size=20), ["vocab_size=20", f"({len(build_char_tokenizer())} tokens)", "resize_token_embeddings"],
    ),
    "positions shorter than prompt + max_new_tokens": (
        dict(max_position_embeddings=10), ["max_position_embeddings in", "=10", "14 tokens"],  # 6 + 8 = 14 > 10
    ),
}


@pytest.mark.parametrize("case", sorted(FOLDER_CASES))
def test_a_model_folder_that_cannot_serve_the_run_is_refused(tmp_path: Path, case: str) -> None:
    changes, must_mention = FOLDER_CASES[case]
    folder = save_model_folder(tmp_path / "model", changes)
    lake = tmp_path / "lake"
    result = run_rlpipe(["train", *ARITHMETIC, "--set", "rollout.max_new_tokens=8", "--set", f'model.path="{folder}"',
                         "--set", f'storage.lake_uri="{lake}"'], tmp_path)
    assert_refused_before_anything(result, lake, must_mention)
    assert str(folder / "config.json") in result.stderr  # the file to fix, named whole


@pytest.mark.parametrize("hidden_size, num_heads", [(130, 4), (128, 3), (100, 7), (5, 4), (250, 6)])
def test_the_hint_for_a_shape_that_does_not_split_proposes_sizes_the_checks_accept(hidden_size: int, num_heads: int) -> None:
    """The hidden sizes the hint proposes pass every attention check (a hint that proposes a
    size the next check refuses sends the user round twice)."""
    import re

    from rlpipe.core.config import check_attention_shape
    from rlpipe.core.errors import ConfigError

    with pytest.raises(ConfigError) as refused:
        check_attention_shape(hidden_size, num_heads, num_heads, None, {})
    proposed = [int(size) for size in re.findall(r"e\.g\. (\d+)(?: or (\d+))?", refused.value.hint)[0] if size]
    assert proposed
    for size in proposed:
        check_attention_shape(size, num_heads, num_heads, None, {})
