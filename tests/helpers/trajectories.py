"""Small, fully populated Trajectory records for storage tests (float32-exact logprobs)."""

from __future__ import annotations

from rlpipe.core.records import Completion, Task, Trajectory, Verdict, VerdictReason, VerifierSpec


def make_trajectory(run_id: str, step: int, index: int, domain: str = "arithmetic") -> Trajectory:
    """One trajectory; reward is None for every 5th index (unscored), else 1.0 / 0.0."""
    task = Task(
        task_id=f"{domain}-{index // 4}",
        domain=domain,
        prompt=f"What is {index} + {step}?",
        verifier=VerifierSpec(kind="exact_match", payload=str(index + step)),
        reference_answer=str(index + step) if index % 2 == 0 else None,
        metadata=(("source", "generator"), ("seed", str(index)), ("ünïcode", "ok")),
    )
    completion = Completion(
        task_id=task.task_id,
        sample_idx=index % 4,
        text=f"{index + step}\n",
        prompt_token_ids=(1, 2, 3, index),
        token_ids=(40 + index, 2),
        logprobs=(-0.5, -1.25),  # exactly representable in float32
        finish_reason="stop",
        policy_version=step,
    )
    reward = None if index % 5 == 4 else float(index % 2 == 0)
    verdict = Verdict(
        reward=reward,
        passed=reward == 1.0,
        reason=VerdictReason.SANDBOX_ERROR if reward is None else VerdictReason.OK if reward else VerdictReason.WRONG,
        detail="" if reward is not None else "sandbox died",
        duration_s=0.001 * index,
        verifier_version="v1-abc",
    )
    return Trajectory(
        run_id=run_id, step=step, policy_version=step, task=task, completion=completion,
        verdict=verdict, advantage=0.25 * (index % 3) - 0.25,
    )


def make_trajectories(run_id: str, step: int, count: int, domain: str = "arithmetic") -> list[Trajectory]:
    return [make_trajectory(run_id, step, index, domain) for index in range(count)]
