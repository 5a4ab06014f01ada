"""Errors and hints print whole, one line each, whatever the console width and path length:
the real command on a 40-column console, with files nested past 200 characters. No assertion
on the width itself: only that each message and the full path arrive unbroken."""

from __future__ import annotations

from pathlib import Path

from tests.cli.cli_process import error_lines, run_rlpipe


def test_a_config_error_names_the_long_config_path_and_key_on_one_line(long_tmp: Path) -> None:
    config = long_tmp / "bad.toml"
    config.write_text("[rollout]\ngroup_sise = 4\n")
    result = run_rlpipe(["train", str(config), "--set", f'storage.lake_uri="{long_tmp / "lake"}"'], long_tmp)
    assert result.returncode == 2, result.stderr
    error, hint = error_lines(result)
    assert error == "error: unknown config key 'rollout.group_sise'"
    assert hint == "hint: did you mean 'group_size'?"


def test_a_missing_config_file_is_named_whole(long_tmp: Path) -> None:
    missing = long_tmp / "no-such-config.toml"
    result = run_rlpipe(["train", str(missing)], long_tmp)
    assert result.returncode == 2, result.stderr
    error, _ = error_lines(result)
    assert error == f"error: config file not found: {missing}"


def test_brackets_in_a_value_are_printed_not_read_as_markup(long_tmp: Path) -> None:
    result = run_rlpipe(["train", "--set", "rollout.group_size=[4]"], long_tmp)
    assert result.returncode == 2, result.stderr
    error, _ = error_lines(result)
    assert "'rollout.group_size'" in error and "(got [4])" in error


def test_verify_says_an_empty_file_holds_no_samples_with_its_whole_path(long_tmp: Path) -> None:
    empty = long_tmp / "samples.jsonl"
    empty.write_text("\n")
    result = run_rlpipe(["verify", "code", "--completions", str(empty)], long_tmp)
    assert result.returncode == 2, result.stderr
    error, hint = error_lines(result)
    assert error == f"error: completions file {empty} holds no samples"
    assert hint == "hint: one JSON object per line"
