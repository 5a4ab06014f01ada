"""DAPO's dynamic sampling and over-long filtering, as pure functions over a step's rows.

A GRPO group whose rewards are all equal has zero advantage everywhere: it costs tokens in
the update and carries no signal. With `rollout.dynamic_sampling`, a step generates in
rounds: round 0 is the usual prompts_per_step groups; while fewer than prompts_per_step
groups have signal and rollout.max_extra_rounds is not spent, another round draws fresh
tasks. `select_groups` then fills the batch with prompts_per_step groups with signal and
puts every other group (no signal, or surplus) apart: the lake keeps both, the trainer sees
only the kept ones. Without dynamic sampling every group of the single round is kept.

Which groups fill the batch: rounds in the order they were generated (a round only runs
while the earlier ones had too few groups with signal, so only the last round can have a
surplus), and within a round a random order seeded by the caller (persist: run seed and
step), as DAPO fills its batch in sampling order. Not task-id order: the rows of a round
arrive sorted by task id (controller/advantage.py), and keeping the first groups of that order
would train the alphabetically first domain and the smallest operands every step. The
order is a function of the groups' task ids and the seed only, not of the rows' order, so a
resumed step that selects again from its staged rows keeps the same groups. Kept and
set-apart rows come out in (round, task id) order.

Over-long filtering: a completion cut at max_new_tokens (finish reason "length") has its
advantage set to None, so the loss leaves it out (rl/samples.py) while its group's
statistics still count it.

Not here: generating the rounds (tasks/step_tasks.py), committing them (controller/persist.py).
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

from rlpipe.core.records import Trajectory

MIN_SIGNAL_RATE = 0.25
"""The smallest signal rate an extra round is sized by (so a step where nothing had
signal yet does not ask for a round 1/0 times the deficit)."""


def groups_of(rows: Sequence[Trajectory]) -> list[list[Trajectory]]:
    """A round's rows as GRPO groups (one per task id), in first-seen order."""
    groups: dict[str, list[Trajectory]] = {}
    for row in rows:
        groups.setdefault(row.task.task_id, []).append(row)
    return list(groups.values())


def has_signal(group: Sequence[Trajectory]) -> bool:
    """At least two scored rows with different rewards (else every advantage is 0)."""
    rewards = {row.verdict.reward for row in group if row.verdict is not None and row.verdict.reward is not None}
    return len(rewards) > 1


def extra_round_size(needed: int, with_signal: int, generated: int, cap: int) -> int:
    """Tasks to draw for the next round: the groups still needed divided by the signal rate
    seen so far (at least MIN_SIGNAL_RATE), at most `cap`."""
    rate = max(with_signal / generated if generated else 1.0, MIN_SIGNAL_RATE)
    return max(1, min(cap, math.ceil(needed / rate)))


@dataclass(frozen=True)
class GroupSelection:
    trained: list[Trajectory]
    set_apart: list[Trajectory]
    metrics: dict[str, float]


def select_groups(rounds: Sequence[Sequence[Trajectory]], prompts_per_step: int, dynamic: bool, *,
                  seed: int) -> GroupSelection:
    """The rows to train on and the rows set apart, with `dynamic/*` metrics; `seed` orders
    the groups of each round (see the module docstring)."""
    groups = [group for rows in rounds for group in sorted(groups_of(rows), key=lambda group: group[0].task.task_id)]
    signal = [has_signal(group) for group in groups]
    if not dynamic:
        kept_index = set(range(len(groups)))
    else:
        kept_index = set([index for index in fill_order(rounds, seed) if signal[index]][:prompts_per_step])
    trained = [row for index, group in enumerate(groups) if index in kept_index for row in group]
    set_apart = [row for index, group in enumerate(groups) if index not in kept_index for row in group]
    with_signal = sum(signal)
    metrics = {
        "dynamic/rounds": float(len(rounds)),
        "dynamic/extra_rounds": float(max(0, len(rounds) - 1)),
        "dynamic/groups_generated": float(len(groups)),
        "dynamic/signal_fraction": with_signal / len(groups) if groups else 0.0,
        "dynamic/groups_trained": float(len(kept_index)),
        "dynamic/batch_fill": len(kept_index) / prompts_per_step,
        "dynamic/surplus_groups": float(max(0, with_signal - prompts_per_step)) if dynamic else 0.0,
    }
    return GroupSelection(trained, set_apart, metrics)


def fill_order(rounds: Sequence[Sequence[Trajectory]], seed: int) -> list[int]:
    """The order in which groups fill the batch, as indexes into the rounds' groups in (round,
    task id) order: round by round, each round's groups shuffled by one `random.Random(seed)`."""
    order = random.Random(seed)
    indexes: list[int] = []
    for rows in rounds:
        start, count = len(indexes), len(groups_of(rows))
        shuffled = list(range(start, start + count))
        order.shuffle(shuffled)
        indexes.extend(shuffled)
    return indexes


def filter_overlong(rows: Sequence[Trajectory]) -> tuple[list[Trajectory], int]:
    """Rows with the advantage of every truncated completion set to None; how many there were."""
    cut = 0
    filtered = []
    for row in rows:
        if row.completion.finish_reason == "length" and row.advantage is not None:
            row, cut = dataclasses.replace(row, advantage=None), cut + 1
        filtered.append(row)
    return filtered, cut
