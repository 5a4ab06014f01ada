"""Tasks read from a file: verl-format Parquet or JSONL, with the verifier named per row.

What it does:
- `FileTasksEnv(name, path)` reads every row once, when built, in batches (BATCH_ROWS
  Parquet rows, or a JSON line, at a time: the file is never in memory whole; the distinct
  tasks are kept). Accepted row shapes (Parquet
  columns or JSON keys):
    verl:  data_source, prompt, ability, reward_model {style, ground_truth}, extra_info {...}
    flat:  prompt, ground_truth (or answer), verifier, id (all but prompt/ground_truth optional)
  `prompt` is a string or a list of chat messages [{role, content}] whose only message is
  the user's (engines render one user message; model.prompt_format = "chat" applies the
  tokenizer's chat template to it). A row's id is `id`, else extra_info.index, else its row
  number.
- The verifier of a row: its `verifier` key (flat), else extra_info.verifier, else
  reward_model.style when that names a verifier, else the env's `verifier` (default exact):
    exact                 the stripped completion equals ground_truth (envs/exact.py);
    math                  the completion is ONE number equal to ground_truth as a rational
                          (verify_math below);
    reasoning_gym:<name>  that reasoning-gym dataset's score_answer on
                          {question: prompt, answer: ground_truth, metadata: extra_info.metadata}.
- A bad file or row (missing file, unreadable Parquet, bad JSON, missing or mistyped field,
  unknown verifier, a math ground truth that is not a number) raises ConfigError naming the
  file, the row and the field, before any training.
- Splits: rows with the same prompt text are one problem (the first row wins); a problem
  is held out iff a hash of (split_seed, prompt text) falls under heldout_fraction, so the
  splits are disjoint, and reproducible for a given split_seed.

What it does not: multi-turn prompts, system messages, verl's reward functions by
data_source, or rows that need a sandbox (code tasks: envs/code.py).
"""

from __future__ import annotations

import json
import random
import re
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

from rlpipe.core.errors import ConfigError
from rlpipe.core.records import Task, Verdict, VerdictReason, VerifierSpec
from rlpipe.envs import exact, reasoning_gym_env
from rlpipe.envs.exact import DETAIL_CHARS, check_split, draw_from_pool, in_heldout, source_version, verify_exact

VERIFIERS = ("exact", "math", "reasoning_gym:<dataset>")
MAX_MATH_CHARS = 200
BATCH_ROWS = 1024
"""Parquet rows decoded at a time when a task file is read."""
_NUMBER = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:/\d+)?", re.ASCII)  # ASCII digits only
_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}(?:\D|$))", re.ASCII)
_BOXED = re.compile(r"\\boxed\{([^{}]*)\}")


@dataclass(frozen=True)
class FileRow:
    """One task row, whatever the file's shape."""

    row_id: str
    prompt: str
    ground_truth: str
    verifier: str
    metadata: str  # JSON of extra_info.metadata (reasoning-gym entries), "{}" if none


def parse_number(text: str) -> Fraction | None:
    """The rational a number's text means ("1,234", "-0.50", "3/4", "$12", "\\boxed{7}", "7."),
    or None when the text is not exactly one number."""
    if len(text) > MAX_MATH_CHARS:
        return None
    text = text.strip()
    boxed = _BOXED.findall(text)
    if boxed:
        text = boxed[-1].strip()
    text = _THOUSANDS.sub("", text.strip().strip("$").rstrip(".").strip())
    if not _NUMBER.fullmatch(text):
        return None
    numerator, _, denominator = text.partition("/")
    if denominator and int(denominator) == 0:
        return None
    return Fraction(numerator) / (Fraction(denominator) if denominator else 1)


def verify_math(completion_text: str, ground_truth: str, verifier_version: str) -> Verdict:
    """1.0 iff the completion is one number equal to `ground_truth` as a rational (0.5 = 1/2 =
    .50, "1,000" = 1000); format when it is not one number (prose, several numbers, empty,
    over MAX_MATH_CHARS), wrong otherwise. Never raises."""
    started = time.perf_counter()
    try:
        expected = parse_number(ground_truth)
        text = completion_text if isinstance(completion_text, str) else str(completion_text)
        got = parse_number(text)
        if got is None:
            reason, detail = VerdictReason.FORMAT, f"expected one number, got {text[:60]!r}"
        elif got == expected:
            reason, detail = VerdictReason.OK, "ok"
        else:
            reason, detail = VerdictReason.WRONG, f"expected {ground_truth[:40]}, got {text.strip()[:40]!r}"
    except Exception as exc:  # a verifier never raises for model output
        reason, detail = VerdictReason.FORMAT, f"unreadable output: {type(exc).__name__}"
    passed = reason is VerdictReason.OK
    return Verdict(reward=1.0 if passed else 0.0, passed=passed, reason=reason, detail=detail[:DETAIL_CHARS],
                   duration_s=time.perf_counter() - started, verifier_version=verifier_version)


def read_rows(path: Path, default_verifier: str = "exact") -> list[FileRow]:
    """Every row of a .parquet or .jsonl file as FileRows; ConfigError naming file/row/field."""
    return list(iter_rows(path, default_verifier))


def iter_rows(path: Path, default_verifier: str = "exact", batch_rows: int = BATCH_ROWS) -> Iterator[FileRow]:
    """The rows of a .parquet or .jsonl file as FileRows, read `batch_rows` Parquet rows (or
    one JSON line) at a time, so the file is never in memory whole; ConfigError naming
    file/row/field (a file without rows included)."""
    if not path.is_file():
        raise ConfigError(f"task file not found: {path}", "set envs.files.<domain>.path to a .parquet or .jsonl file")
    if path.suffix == ".parquet":
        records = _parquet_records(path, batch_rows)
    elif path.suffix in (".jsonl", ".json"):
        records = _jsonl_records(path)
    else:
        raise ConfigError(f"task file {path} is neither .parquet nor .jsonl", "convert it to verl Parquet or JSON lines")
    empty = True
    for number, record in records:
        empty = False
        yield _row(path, number, record, default_verifier)
    if empty:
        raise ConfigError(f"task file {path} has no rows", "add tasks to it")


def _parquet_records(path: Path, batch_rows: int) -> Iterator[tuple[int, Any]]:
    import pyarrow.parquet as pq

    number = 0
    try:
        parquet = pq.ParquetFile(path)
        for batch in parquet.iter_batches(batch_size=batch_rows):
            for record in batch.to_pylist():
                yield number, record
                number += 1
    except ConfigError:
        raise
    except Exception as exc:  # pyarrow raises several types for a damaged file
        raise ConfigError(f"task file {path} is not readable Parquet: {type(exc).__name__}: {str(exc)[:200]}",
                          "write it with pyarrow or pandas (verl's format)") from exc


def _jsonl_records(path: Path) -> Iterator[tuple[int, Any]]:
    with path.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ConfigError(f"{path}: row {number} (line {number + 1}) is not valid JSON: {exc}", "one JSON object per line") from exc
            yield number, record


def _row(path: Path, number: int, record: Any, default_verifier: str) -> FileRow:
    def bad(field: str, problem: str) -> ConfigError:
        return ConfigError(f"{path}: row {number}: field {field!r} {problem}",
                           "each row needs prompt (text or [{role: user, content}]) and ground_truth "
                           "(or reward_model.ground_truth); see docs/ENVIRONMENTS.md")

    if not isinstance(record, dict):
        raise bad("(row)", f"is a {type(record).__name__}, not an object")
    reward_model = record.get("reward_model") or {}
    extra_info = record.get("extra_info") or {}
    if not isinstance(reward_model, dict):
        raise bad("reward_model", f"is a {type(reward_model).__name__}, not an object {{style, ground_truth}}")
    if not isinstance(extra_info, dict):
        raise bad("extra_info", f"is a {type(extra_info).__name__}, not an object")
    prompt = _prompt_text(record.get("prompt"), bad)
    truth_field = "ground_truth" if "ground_truth" in record else "answer" if "answer" in record else "reward_model.ground_truth"
    truth = record.get("ground_truth", record.get("answer", reward_model.get("ground_truth")))
    if isinstance(truth, bool) or not isinstance(truth, (str, int, float)) or not str(truth).strip():
        raise bad(truth_field, f"must be a non-empty string or number, got {truth!r:.60}")
    style = reward_model.get("style")
    verifier = record.get("verifier") or extra_info.get("verifier") or (style if _known_verifier(style) else default_verifier)
    if not _known_verifier(verifier):
        raise bad("verifier", f"names an unknown verifier {verifier!r}: known {', '.join(VERIFIERS)}")
    if verifier == "math" and parse_number(str(truth)) is None:
        raise bad(truth_field, f"is not a number, but the row's verifier is math: {truth!r:.60}")
    metadata = extra_info.get("metadata") or {}
    try:
        metadata_json = json.dumps(metadata, sort_keys=True)
    except TypeError as exc:
        raise bad("extra_info.metadata", f"is not JSON data: {exc}") from exc
    row_id = record.get("id", extra_info.get("index", number))
    return FileRow(row_id=str(row_id), prompt=prompt, ground_truth=str(truth), verifier=str(verifier), metadata=metadata_json)


def _prompt_text(prompt: Any, bad: Any) -> str:
    if isinstance(prompt, str) and prompt.strip():
        return prompt
    if isinstance(prompt, list) and prompt:
        if len(prompt) != 1 or not isinstance(prompt[0], dict) or prompt[0].get("role") != "user":
            raise bad("prompt", "must hold exactly one message, the user's (multi-turn and system prompts are not supported)")
        content = prompt[0].get("content")
        if isinstance(content, str) and content.strip():
            return content
        raise bad("prompt[0].content", f"must be non-empty text, got {content!r:.60}")
    raise bad("prompt", f"must be non-empty text or a list of chat messages, got {prompt!r:.60}")


def _known_verifier(name: Any) -> bool:
    if not isinstance(name, str):
        return False
    if name.startswith("reasoning_gym:"):
        return name.partition(":")[2] in reasoning_gym_env.known_datasets()
    return name in ("exact", "math")


class FileTasksEnv:
    """Rows of a task file as a domain; see the module docstring."""

    needs_sandbox = False

    def __init__(self, name: str, path: str, verifier: str = "exact", heldout_fraction: float = 0.2, split_seed: int = 0,
                 prompt_template: str = "{question}") -> None:
        if not 0 < heldout_fraction < 1:
            raise ValueError(f"heldout_fraction must be in (0, 1), got {heldout_fraction}")
        if "{question}" not in prompt_template:
            raise ValueError(f"prompt_template must contain {{question}}, got {prompt_template!r}")
        if not _known_verifier(verifier):
            raise ValueError(f"unknown default verifier {verifier!r}: known {', '.join(VERIFIERS)}")
        self.name = name
        self.path = Path(path)
        self.prompt_template = prompt_template
        unique: dict[str, FileRow] = {}
        ids: dict[str, tuple[int, str]] = {}  # row id -> (first row number, its prompt)
        count = 0
        for number, row in enumerate(iter_rows(self.path, verifier)):  # read in batches, never whole
            first = ids.setdefault(row.row_id, (number, row.prompt))
            if first[1] != row.prompt:
                raise ConfigError(f"{self.path}: row {number}: field 'id' repeats {row.row_id!r} of row {first[0]} "
                                  "with another prompt", "give every task its own id (or none: the row number is used)")
            unique.setdefault(row.prompt, row)
            count += 1
        self.duplicates = count - len(unique)
        self._splits: dict[str, list[FileRow]] = {"train": [], "heldout": []}
        for row in unique.values():
            self._splits["heldout" if in_heldout(f"{split_seed}:{row.prompt}", heldout_fraction) else "train"].append(row)
        self.verifier_version = source_version(
            (exact, reasoning_gym_env, sys.modules[__name__]),
            (("verifier", verifier), ("heldout_fraction", heldout_fraction), ("split_seed", split_seed)),
        )

    def split_size(self, split: str) -> int:
        check_split(split)
        return len(self._splits[split])

    def tasks(self, split: str, count: int, seed: int) -> list[Task]:
        """`count` rows of the split, distinct while it has enough (then repeating), seeded."""
        check_split(split)
        pool = self._splits[split]
        if not pool:
            raise ValueError(f"the {split} split of {self.name} ({self.path}) is empty; add rows or change heldout_fraction")
        rng = random.Random(f"{self.name}:{split}:{seed}")
        return [self._task(row, split) for row in draw_from_pool(pool, count, rng)]

    def verify(self, task: Task, completion_text: str, sandbox: object | None = None) -> Verdict:
        kind, payload = task.verifier.kind, json.loads(task.verifier.payload)
        truth = payload["ground_truth"]
        if kind == "exact":
            return verify_exact(completion_text, truth, self.verifier_version)
        if kind == "math":
            return verify_math(completion_text, truth, self.verifier_version)
        started = time.perf_counter()
        dataset = kind.partition(":")[2]
        entry = {"question": payload["question"], "answer": truth, "metadata": json.loads(payload["metadata"])}
        reward, reason, detail = reasoning_gym_env.judge_with_score_answer(
            reasoning_gym_env.default_score_answer(dataset), completion_text, entry)
        return Verdict(reward=reward, passed=reason is VerdictReason.OK, reason=reason, detail=detail[:DETAIL_CHARS],
                       duration_s=time.perf_counter() - started, verifier_version=self.verifier_version)

    def _task(self, row: FileRow, split: str) -> Task:
        payload = {"ground_truth": row.ground_truth}
        if row.verifier.startswith("reasoning_gym:"):
            payload.update(question=row.prompt, metadata=row.metadata)
        return Task(
            task_id=f"{self.name}/{row.row_id}",
            domain=self.name,
            prompt=self.prompt_template.replace("{question}", row.prompt),
            verifier=VerifierSpec(kind=row.verifier, payload=json.dumps(payload)),
            reference_answer=row.ground_truth,
            metadata=(("split", split), ("source", str(self.path))),
        )
