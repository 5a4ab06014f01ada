"""The async schedule's arithmetic, the staleness guard, DAPO's group selection and
over-long filtering, on hand-built rows."""

from __future__ import annotations

import dataclasses

from rlpipe.core.records import Trajectory, Verdict, VerdictReason
from rlpipe.rl.dynamic_sampling import extra_round_size, filter_overlong, has_signal, select_groups
from rlpipe.rl.staleness import generation_version, is_fresh, split_stale_table, staleness_metrics
from rlpipe.storage.schema import to_table
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
    assert [row.policy_version for row in rows if is_fresh(5, row.policy_version, max_staleness=1)] == [3]
    table = to_table(rows)  # the trainer worker's update splits the columns it read
    fresh, dropped = split_stale_table(table, step=5, max_staleness=1)
    assert fresh.column("policy_version").to_pylist() == [3] and dropped == 2
    fresh, dropped = split_stale_table(table, step=5, max_staleness=2)
    assert fresh.column("policy_version").to_pylist() == [3, 2] and dropped == 1
    assert fresh.column("sample_idx").to_pylist() == [0, 1]  # the rows themselves, in order
    # staleness 1, 2, 3 once each: fractions 1/3, mean (1 + 2 + 3) / 3 = 2
    metrics = staleness_metrics([row.policy_version for row in rows], step=5)
    assert metrics["async/staleness_1"] == metrics["async/staleness_3"] == 1 / 3
    assert metrics["async/staleness_mean"] == 2.0


def test_a_group_has_signal_only_when_its_scored_rewards_differ() -> None:
    assert has_signal(_group("a", [1.0, 0.0, 0.0]))
    assert not has_signal(_group("a", [1.0, 1.0, 1.0]))
    assert not has_signal(_group("a", [0.0, None, 0.0]))  # the unscored row does not count
    assert not has_signal(_group("a", [1.0]))


def test_dynamic_sampling_keeps_earlier_rounds_first_and_fills_up_from_the_last() -> None:
    round_0 = _group("a", [1.0, 0.0]) + _group("b", [0.0, 0.0]) + _group("c", [1.0, 1.0])
    round_1 = _group("d", [0.0, 1.0]) + _group("e", [1.0, 0.0]) + _group("f", [0.0, 0.0])
    for seed in range(8):
        selection = select_groups([round_0, round_1], prompts_per_step=2, dynamic=True, seed=seed)
        trained = {row.task.task_id for row in selection.trained}
        # a (round 0) always; one of d, e (round 1's groups with signal) fills the batch
        assert "a" in trained and len(trained & {"d", "e"}) == 1 and len(trained) == 2
        set_apart = {row.task.task_id for row in selection.set_apart}
        assert set_apart == {"b", "c", "f"} | ({"d", "e"} - trained)
        assert selection.metrics["dynamic/extra_rounds"] == 1.0
        assert selection.metrics["dynamic/signal_fraction"] == 3 / 6
        assert selection.metrics["dynamic/batch_fill"] == 1.0
        assert selection.metrics["dynamic/surplus_groups"] == 1.0


def test_surplus_groups_are_not_chosen_by_task_id_order() -> None:
    # 20 groups with signal, 5 wanted. The old rule (rows sorted by task id, first 5 kept)
    # kept t00..t04 on every step; the seeded order keeps each group in about 1 step of 4.
    ids = [f"t{index:02d}" for index in range(20)]
    round_0 = [row for task in ids for row in _group(task, [1.0, 0.0])]  # sorted by task id, as controller/advantage.py hands them
    steps = 200
    kept_count = dict.fromkeys(ids, 0)
    for seed in range(steps):
        selection = select_groups([round_0], prompts_per_step=5, dynamic=True, seed=seed)
        trained = {row.task.task_id for row in selection.trained}
        assert len(trained) == 5
        for task in trained:
            kept_count[task] += 1
    alphabetical_first = ids[:5]
    assert sum(kept_count[task] for task in alphabetical_first) < steps * 5 / 2  # 1000 under the old rule
    assert all(steps / 8 < count < steps * 3 / 8 for count in kept_count.values())  # each near 200 / 4 = 50


def test_the_selection_depends_on_the_seed_and_the_groups_not_on_the_rows_order() -> None:
    # persist selects again from the staged rows when a step is retried or resumed
    rows = [row for task in ("p", "q", "r", "s", "t", "u") for row in _group(task, [1.0, 0.0])]
    first = select_groups([rows], prompts_per_step=2, dynamic=True, seed=7)
    again = select_groups([list(reversed(rows))], prompts_per_step=2, dynamic=True, seed=7)
    assert {(row.task.task_id, row.completion.sample_idx) for row in first.trained} == \
        {(row.task.task_id, row.completion.sample_idx) for row in again.trained}
    others = {frozenset(row.task.task_id for row in select_groups([rows], 2, True, seed=seed).trained) for seed in range(20)}
    assert len(others) > 1  # another seed, another choice


def test_dynamic_sampling_that_ran_out_of_rounds_trains_a_partial_batch() -> None:
    selection = select_groups([_group("a", [1.0, 0.0]) + _group("b", [1.0, 1.0])], prompts_per_step=2, dynamic=True, seed=0)
    assert {row.task.task_id for row in selection.trained} == {"a"}
    assert selection.metrics["dynamic/batch_fill"] == 0.5


def test_without_dynamic_sampling_every_group_trains() -> None:
    rows = _group("a", [1.0, 0.0]) + _group("b", [0.0, 0.0])
    selection = select_groups([rows], prompts_per_step=2, dynamic=False, seed=0)
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
