"""The paired comparison of two evaluations of one held-out set (benchmarks/paired_evals.py)
on hand-computed cases: the mean of the per-task differences, its standard error, the tasks
gained and lost, and the exact two-sided McNemar p value."""

from __future__ import annotations

import math

import pytest

from benchmarks.paired_evals import paired, task_outcomes


def test_paired_difference_error_and_mcnemar_by_hand() -> None:
    result = paired({"a": 0, "b": 0, "c": 1, "d": 1}, {"a": 1, "b": 1, "c": 1, "d": 0})
    # differences 1, 1, 0, -1: mean 0.25; sample variance 2.75 / 3; SE sqrt(2.75 / 3 / 4)
    assert result["difference"] == pytest.approx(0.25) and result["se"] == pytest.approx(math.sqrt(2.75 / 12))
    # 3 discordant tasks, 2 gained and 1 lost: p = 2 (C(3,0) + C(3,1)) / 2^3, capped at 1
    assert (result["gained"], result["lost"], result["mcnemar_p"]) == (2, 1, 1.0)


def test_five_lost_and_none_gained_is_p_one_sixteenth() -> None:
    result = paired({str(i): 1.0 for i in range(10)}, {str(i): 0.0 if i < 5 else 1.0 for i in range(10)})
    assert (result["gained"], result["lost"]) == (0, 5) and result["mcnemar_p"] == pytest.approx(2 / 32)


def test_evaluations_of_different_task_sets_are_refused() -> None:
    with pytest.raises(ValueError, match="not one held-out set"):
        paired({"a": 1.0}, {"b": 1.0})


def test_only_the_task_entries_of_a_document_are_read() -> None:
    assert task_outcomes({"accuracy/agent_tasks": 0.5, "task/x#1": 1.0, "n/agent_tasks": 2}) == {"x#1": 1.0}
