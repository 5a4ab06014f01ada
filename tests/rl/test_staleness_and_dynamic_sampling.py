"""The async schedule's arithmetic, the staleness guard, DAPO's group selection and
over-long filtering, on hand-built rows."""

from __future__ import annotations

import dataclasses

from rlpipe.core.records import Trajectory, Verdict, VerdictReason
from rlpipe.rl.dynamic_sampling import extra_round_size, filter_overlong, has_signal, select_groups
from rlpipe.rl.staleness import generation_version, split_stale, staleness_metrics
from tests.helpers.trajectories import make_trajectory


def _row(task: str, sample: int, reward: float | None, version: int = 0, finish: str = "stop") -> Trajectory:
    base = make_trajectory("run", 1, 0)
    verdict = Verdict(reward=reward, passed=reward == 1.0,
                      reason=VerdictReason.SANDBOX_ERROR if reward is None else VerdictReason.OK)
    return dataclasses.replace(
        base, policy_version=version, verdict=verdict, advantage=0.5,
        task=dataclasses.replace(base.task, task_id=task),
        completion=dataclasses.replace(base.completion, task_id=task, sample_idx=sample, finish_reason=finish, policy_version=version),
    )


def _group(task: str, rewards: list[float | None], version: int = 0) -> list[Trajectory]:
    return [_row(task, index, reward, version) for index, reward in enumerate(rewards)]


def test_generation_version_follows_the_fixed_schedule() -> None:
    # k = 0: step s by version s-1; k = 1: steps 1 and 2 by version 0, then s-2; k = 2: 1..3 by 0
    assert [generation_version(step, 0) for step in range(1, 6)] == [0, 1, 2, 3, 4]
    assert [generation_version(step, 1) for step in range(1, 6)] == [0, 0, 1, 2, 3]
    assert [generation_version(step, 2) for step in range(1, 6)] == [0, 0, 0, 1, 2]


def test_rows_older_than_the_bound_are_dropped_and_counted() -> None:
    # at step 5 the trainer is at version 4: version 3 is 1 behind, 2 is 2 behind, 1 is 3 behind
    rows = [_row("a", 0, 1.0, version=3), _row("a", 1, 0.0, version=2), _row("a", 2, 0.0, version=1)]
    fresh, dropped = split_stale(rows, step=5, max_staleness=1)
    assert [row.policy_version for row in fresh] == [3] and dropped == 2
    fresh, dropped = split_stale(rows, step=5, max_staleness=2)
    assert [row.policy_version for row in fresh] == [3, 2] and dropped == 1
    # staleness 1, 2, 3 once each: fractions 1/3, mean (1 + 2 + 3) / 3 = 2
    metrics = staleness_metrics(rows, step=5)
    assert metrics["async/staleness_1"] == metrics["async/staleness_3"] == 1 / 3
    assert metrics["async/staleness_mean"] == 2.0


def test_a_group_has_signal_only_when_its_scored_rewards_differ() -> None:
    assert has_signal(_group("a", [1.0, 0.0, 0.0]))
    assert not has_signal(_group("a", [1.0, 1.0, 1.0]))
    assert not has_signal(_group("a", [0.0, None, 0.0]))  # the unscored row does not count
    assert not has_signal(_group("a", [1.0]))


def test_dynamic_sampling_keeps_the_first_groups_with_signal_up_to_the_batch() -> None:
    round_0 = _group("a", [1.0, 0.0]) + _group("b", [0.0, 0.0]) + _group("c", [1.0, 1.0])
    round_1 = _group("d", [0.0, 1.0]) + _group("e", [1.0, 0.0]) + _group("f", [0.0, 0.0])
    selection = select_groups([round_0, round_1], prompts_per_step=2, dynamic=True)
    assert sorted({row.task.task_id for row in selection.trained}) == ["a", "d"]
    # b, c, f have no signal; e has signal but the batch is full with a and d (surplus)
    assert sorted({row.task.task_id for row in selection.set_apart}) == ["b", "c", "e", "f"]
    assert selection.metrics["dynamic/extra_rounds"] == 1.0
    assert selection.metrics["dynamic/signal_fraction"] == 3 / 6
    assert selection.metrics["dynamic/batch_fill"] == 1.0
    assert selection.metrics["dynamic/surplus_groups"] == 1.0


def test_dynamic_sampling_that_ran_out_of_rounds_trains_a_partial_batch() -> None:
    selection = select_groups([_group("a", [1.0, 0.0]) + _group("b", [1.0, 1.0])], prompts_per_step=2, dynamic=True)
    assert {row.task.task_id for row in selection.trained} == {"a"}
    assert selection.metrics["dynamic/batch_fill"] == 0.5


def test_without_dynamic_sampling_every_group_trains() -> None:
    rows = _group("a", [1.0, 0.0]) + _group("b", [0.0, 0.0])
    selection = select_groups([rows], prompts_per_step=2, dynamic=False)
    assert selection.trained == rows and selection.set_apart == []


def test_an_extra_round_is_sized_by_the_signal_rate_seen() -> None:
    # 6 groups still needed, 2 of 8 had signal (rate 0.25): ceil(6 / 0.25) = 24, capped at 16
    assert extra_round_size(needed=6, with_signal=2, generated=8, cap=16) == 16
    # 3 needed at rate 4/8 = 0.5: 6 tasks
    assert extra_round_size(needed=3, with_signal=4, generated=8, cap=16) == 6
    # nothing had signal: sized by the floor rate 0.25, 2 needed -> 8
    assert extra_round_size(needed=2, with_signal=0, generated=8, cap=16) == 8


def test_overlong_filter_leaves_truncated_completions_out_of_the_loss() -> None:
    rows = [_row("a", 0, 1.0, finish="length"), _row("a", 1, 0.0)]
    filtered, cut = filter_overlong(rows)
    assert cut == 1
    assert [row.advantage for row in filtered] == [None, 0.5]
