"""What the trainer worker's update pays to read a step's committed rows back from the lake,
side by side in one process: the column path it takes (`Lake.read_parts_table` of
TRAIN_COLUMNS, the stale split, `train_samples_from_table`) against the Trajectory path
(`Lake.read_parts` then `train_samples`), which gives the same samples; and, for scale, the
two writes of a step's rows (generate's staged rows, the committed part with its fsync).

    OMP_NUM_THREADS=1 PYTHONPATH=$PWD .venv/bin/python benchmarks/trainer_read.py [--rows 1024]

Rows are made up in the quickstart's shape at 128 x 8 (groups of 8 sharing one Task, short
prompts and replies, task metadata of three pairs); the part is on a local temporary folder. Prints
milliseconds per call (median of --repeats, each the mean of --calls) and the ratio.
Not measured here: an S3 lake's round trips, the update itself.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable

from rlpipe.core.records import Completion, Task, Trajectory, Verdict, VerdictReason, VerifierSpec
from rlpipe.rl.samples import TRAIN_COLUMNS, train_samples, train_samples_from_table
from rlpipe.rl.staleness import split_stale_table
from rlpipe.storage.lake import Lake


def made_up_rows(count: int, group: int, prompt_tokens: int, reply_tokens: int) -> list[Trajectory]:
    rows = []
    for index in range(count):
        if index % group == 0:  # the rows of a group share one Task, as generate makes them
            task = Task(task_id=f"reverse-{index // group}", domain="reverse", prompt=f"Reverse: word{index // group}",
                        verifier=VerifierSpec(kind="exact_match", payload=f"{index // group}drow"),
                        metadata=(("source", "generator"), ("seed", str(index // group)), ("split", "train")))
        completion = Completion(task_id=task.task_id, sample_idx=index % group, text="x" * reply_tokens,
                                prompt_token_ids=tuple(range(prompt_tokens)), token_ids=tuple(range(reply_tokens)),
                                logprobs=tuple(-0.1 * token for token in range(reply_tokens)), finish_reason="stop",
                                policy_version=1)
        verdict = Verdict(reward=float(index % 2), passed=bool(index % 2), reason=VerdictReason.OK)
        rows.append(Trajectory(run_id="r", step=2, policy_version=1, task=task, completion=completion,
                               verdict=verdict, advantage=0.5 - index % 2))
    return rows


def timed_ms(call: Callable[[], object], calls: int, repeats: int) -> float:
    call()  # warm
    means = []
    for _ in range(repeats):
        started = time.perf_counter()
        for _ in range(calls):
            call()
        means.append((time.perf_counter() - started) / calls * 1000)
    return statistics.median(means)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1024)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--prompt-tokens", type=int, default=12)
    parser.add_argument("--reply-tokens", type=int, default=7)
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    rows = made_up_rows(args.rows, args.group, args.prompt_tokens, args.reply_tokens)
    with tempfile.TemporaryDirectory(prefix="trainer-read-") as folder:
        measure(Lake.open(folder), rows, args)


def measure(lake: Lake, rows: list[Trajectory], args: argparse.Namespace) -> None:
    """Time the two reads of `rows` committed in `lake`, and the two writes, and print them."""
    part = lake.write_part("r", 2, "00000", rows)

    def columns() -> list:
        fresh, _ = split_stale_table(lake.read_parts_table([part], columns=TRAIN_COLUMNS), step=2, max_staleness=0)
        return train_samples_from_table(fresh)

    def trajectories() -> list:
        return train_samples(lake.read_parts([part]))

    if columns() != trajectories():
        raise SystemExit("the two paths gave different samples")
    column_ms = timed_ms(columns, args.calls, args.repeats)
    row_ms = timed_ms(trajectories, args.calls, args.repeats)
    staged_ms = timed_ms(lambda: lake.write_staged("r", 2, "generate", "key", rows), args.calls, args.repeats)
    part_ms = timed_ms(lambda: lake.write_part("r", 2, "00001", rows), args.calls, args.repeats)
    print(f"{args.rows} rows (groups of {args.group}, {args.prompt_tokens}-token prompts, {args.reply_tokens}-token replies)")
    print(f"read, columns (the trainer worker's path): {column_ms:7.2f} ms")
    print(f"read, Trajectory rows then train_samples:  {row_ms:7.2f} ms")
    print(f"columns / rows: {column_ms / row_ms:.2f}")
    print(f"for scale: write_staged {staged_ms:.2f} ms, write_part (fsynced) {part_ms:.2f} ms")


if __name__ == "__main__":
    main()
