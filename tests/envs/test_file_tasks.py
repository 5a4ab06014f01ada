"""Tasks from files (envs/file_tasks.py): verl Parquet and JSONL rows, the verifier named per
row, bad files and rows as ConfigErrors naming file/row/field, a seeded disjoint split."""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rlpipe.core.errors import ConfigError
from rlpipe.core.records import VerdictReason
from rlpipe.envs.file_tasks import FileTasksEnv, parse_number, verify_math
from rlpipe.envs.mixture import build_env


def verl_rows(count: int) -> list[dict]:
    rows = []
    for i in range(count):
        rows.append({
            "data_source": "toy/sums",
            "prompt": [{"role": "user", "content": f"What is {i} + {i}?"}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": str(2 * i)},
            "extra_info": {"index": i, "split": "train", "verifier": "math" if i % 2 else "exact"},
        })
    return rows


def write_parquet(path: Path, rows: list[dict]) -> Path:
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def test_verl_parquet_rows_become_tasks_with_their_verifier(tmp_path: Path) -> None:
    env = FileTasksEnv("sums", str(write_parquet(tmp_path / "sums.parquet", verl_rows(40))), heldout_fraction=0.25)
    assert env.split_size("train") + env.split_size("heldout") == 40
    tasks = env.tasks("train", env.split_size("train"), seed=0) + env.tasks("heldout", env.split_size("heldout"), seed=0)
    by_id = {task.task_id: task for task in tasks}
    odd, even = by_id["sums/7"], by_id["sums/8"]
    assert (odd.prompt, odd.verifier.kind, odd.reference_answer) == ("What is 7 + 7?", "math", "14")
    assert even.verifier.kind == "exact"
    assert env.verify(odd, "14.0").reward == 1.0  # math: 14.0 = 14
    assert env.verify(even, "16.0").reward == 0.0  # exact: "16.0" is not "16"
    assert env.verify(even, " 16\n").reward == 1.0
    for task in tasks:
        assert env.verify(task, task.reference_answer).passed


def test_split_is_disjoint_seeded_and_deduplicated(tmp_path: Path) -> None:
    rows = verl_rows(60) + verl_rows(5)  # rows 0..4 twice: the same prompts, one problem each
    for extra in rows[60:]:
        extra["extra_info"] = {"index": 100 + extra["extra_info"]["index"]}
    path = write_parquet(tmp_path / "dup.parquet", rows)
    env = FileTasksEnv("sums", str(path), heldout_fraction=0.3, split_seed=0)
    assert env.duplicates == 5
    train = {task.prompt for task in env.tasks("train", env.split_size("train"), seed=0)}
    heldout = {task.prompt for task in env.tasks("heldout", env.split_size("heldout"), seed=0)}
    assert not train & heldout and len(train | heldout) == 60
    other = FileTasksEnv("sums", str(path), heldout_fraction=0.3, split_seed=1)
    assert {task.prompt for task in other.tasks("heldout", other.split_size("heldout"), seed=0)} != heldout
    assert [t.task_id for t in env.tasks("train", 10, seed=4)] == [t.task_id for t in env.tasks("train", 10, seed=4)]


def test_jsonl_flat_rows_and_reasoning_gym_verifier(tmp_path: Path) -> None:
    rows = [
        {"id": "a", "prompt": "Spell this word backward (example: sun -> nus): cat", "ground_truth": "tac",
         "verifier": "reasoning_gym:spell_backward"},
        {"id": "b", "prompt": "Half of one?", "answer": "1/2", "verifier": "math"},
        {"id": "c", "prompt": "Capital of France?", "ground_truth": "Paris"},
    ]
    env = build_env("toy", files={"toy": {"path": str(write_jsonl(tmp_path / "toy.jsonl", rows)), "heldout_fraction": 0.01}})
    tasks = {task.task_id: task for task in env.tasks("train", 3, seed=0)}
    assert set(tasks) == {"toy/a", "toy/b", "toy/c"}
    assert env.verify(tasks["toy/a"], "TAC").reward == 1.0  # spell_backward's score_answer ignores case
    assert env.verify(tasks["toy/a"], "tca").reward == 0.0
    assert env.verify(tasks["toy/b"], "0.5").reward == 1.0
    assert env.verify(tasks["toy/c"], "Paris").reward == 1.0 and env.verify(tasks["toy/c"], "paris").reward == 0.0


@pytest.mark.parametrize(("row", "field"), [
    ({"ground_truth": "1"}, "'prompt'"),
    ({"prompt": "q"}, "'reward_model.ground_truth'"),
    ({"prompt": "q", "ground_truth": ["1"]}, "'ground_truth'"),
    ({"prompt": [{"role": "system", "content": "s"}, {"role": "user", "content": "q"}], "ground_truth": "1"}, "'prompt'"),
    ({"prompt": [{"role": "user", "content": ""}], "ground_truth": "1"}, "'prompt[0].content'"),
    ({"prompt": "q", "ground_truth": "1", "verifier": "fuzzy"}, "'verifier'"),
    ({"prompt": "q", "ground_truth": "1", "verifier": "reasoning_gym:nope"}, "'verifier'"),
    ({"prompt": "q", "ground_truth": "seven", "verifier": "math"}, "'ground_truth'"),
    ({"prompt": "q", "reward_model": "1"}, "'reward_model'"),
    ([1, 2], "'(row)'"),
])
def test_bad_rows_name_file_row_and_field(tmp_path: Path, row, field: str) -> None:
    path = write_jsonl(tmp_path / "bad.jsonl", [{"prompt": "fine", "ground_truth": "1"}, row])
    with pytest.raises(ConfigError) as caught:
        FileTasksEnv("bad", str(path))
    assert str(path) in caught.value.args[0] and "row 1" in caught.value.args[0] and field in caught.value.args[0]


def test_bad_files_are_config_errors(tmp_path: Path) -> None:
    broken = tmp_path / "broken.parquet"
    broken.write_bytes(b"PAR1 not really")
    bad_json = tmp_path / "bad.jsonl"
    bad_json.write_text('{"prompt": "q", "ground_truth": "1"}\n{oops\n')
    cases = [(tmp_path / "missing.jsonl", "not found"), (broken, "not readable Parquet"), (bad_json, "row 1 (line 2)"),
             (write_jsonl(tmp_path / "empty.jsonl", []), "no rows"), (write_jsonl(tmp_path / "t.csv", []), "neither")]
    for path, message in cases:
        with pytest.raises(ConfigError, match=message.replace("(", "\\(").replace(")", "\\)")):
            build_env("f", files={"f": {"path": str(path)}})
    same_id = [{"id": 1, "prompt": "a", "ground_truth": "1"}, {"id": 1, "prompt": "b", "ground_truth": "2"}]
    with pytest.raises(ConfigError, match="row 1: field 'id' repeats"):
        FileTasksEnv("f", str(write_jsonl(tmp_path / "ids.jsonl", same_id)))


def test_parse_number_and_math_verifier() -> None:
    assert parse_number("1,234") == 1234 and parse_number("$12") == 12 and parse_number("7.") == 7
    assert parse_number("-0.50") == Fraction(-1, 2) and parse_number("3/4") == Fraction(3, 4)
    assert parse_number("\\boxed{42}") == 42 and parse_number(".5") == Fraction(1, 2)
    for not_one_number in ("", "1 2", "12 apples", "1/0", "1e5", "nan", "١٢", "9" * 300):
        assert parse_number(not_one_number) is None, not_one_number
    assert verify_math("0.75", "3/4", "v").reward == 1.0
    assert verify_math("0.7", "3/4", "v").reason is VerdictReason.WRONG
    for hostile in ("", "3/4 0.75", "x" * 10**6, "The answer is 3/4"):
        verdict = verify_math(hostile, "3/4", "v")
        assert (verdict.reward, verdict.reason) == (0.0, VerdictReason.FORMAT)


def test_files_are_read_in_batches_with_their_row_numbers(tmp_path: Path) -> None:
    import itertools
    import tracemalloc

    from rlpipe.envs.file_tasks import iter_rows, read_rows

    rows = [{"prompt": f"{i}:" + "q" * 5000, "ground_truth": str(i)} for i in range(2000)]
    rows[1234]["ground_truth"] = ""
    path = tmp_path / "many.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=300)
    with pytest.raises(ConfigError, match="row 1234: field 'ground_truth'"):  # numbered across batches
        list(iter_rows(path, batch_rows=100))
    rows[1234]["ground_truth"] = "1234"
    pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=300)
    tracemalloc.start()
    try:
        seen = sum(1 for _ in iter_rows(path, batch_rows=100))  # each row dropped once counted
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert seen == 2000 and peak < 2000 * 5000 / 2  # a batch of decoded rows, not the file's
    assert [row.prompt for row in read_rows(path)] == [row["prompt"] for row in rows]
    # a JSON-lines file is read a line at a time: its first rows come before a bad line is read
    lines = write_jsonl(tmp_path / "lines.jsonl", [{"prompt": "a", "ground_truth": "1"}, {"prompt": "b", "ground_truth": "2"}])
    lines.write_text(lines.read_text() + "{oops\n")
    assert [row.prompt for row in itertools.islice(iter_rows(lines), 2)] == ["a", "b"]
    with pytest.raises(ConfigError, match=r"row 2 \(line 3\)"):
        list(iter_rows(lines))
