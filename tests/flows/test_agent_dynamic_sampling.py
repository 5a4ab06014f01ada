"""Dynamic sampling (rl/dynamic_sampling.py) on multi-turn agent episodes: the `rollout` task
(tasks/step_tasks.py) with `rollout.dynamic_sampling` on agent_tasks runs whole episodes in a
real bubblewrap pool, round after round, and commits only groups whose episodes' rewards
differ; the rest stay in the lake under set_apart/.

The engine is scripted per family (a fake of the Generate protocol whose tokens are
character codes): lookup tasks' even episodes play the oracle and the odd ones submit at
once (a group with signal); count tasks' episodes all play the oracle (all pass); the other
families' episodes all submit at once (all fail). So round 0 of 4 tasks rarely holds 4
groups with signal, and the step must draw further rounds of fresh tasks.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import pytest

from rlpipe.controller.runtime import RunRecords, Runtime, Workers
from rlpipe.controller.sample import build_mixture
from rlpipe.core.config import load_config
from rlpipe.core.records import Completion
from rlpipe.envs.mixture import Mixture
from rlpipe.sandbox.base import Limits
from rlpipe.tasks.step_tasks import rollout
from rlpipe.workers.lake_access import build_lake
from rlpipe.workers.protocol import GenerateResult
from tests.sandbox._bwrap_support import require_bwrap

WANTED, GROUP, EXTRA_ROUNDS = 4, 2, 3


class RecordingMixture(Mixture):
    """The run's mixture, keeping every task a round drew (the engine is given only ids)."""

    def __init__(self, base: Mixture) -> None:
        super().__init__(base.envs, base.ratios)
        self.drawn: dict = {}

    def sample(self, count, rng_seed, ratios=None):
        tasks = super().sample(count, rng_seed, ratios)
        self.drawn.update((task.task_id, task) for task in tasks)
        return tasks


class FamilyScriptedEngine:
    """Generate served in-process: each episode's replies by its task's family (module docstring)."""

    def __init__(self, mixture: RecordingMixture) -> None:
        self.mixture = mixture
        self.calls: dict[str, int] = defaultdict(int)
        self.asked: list[str] = []  # task ids, in the order their episodes first asked

    def generate(self, prompts, params, **options) -> GenerateResult:
        completions = []
        for key, context in prompts:
            task_id, _, sample = key.rpartition("#")
            task = self.mixture.drawn[task_id]
            if self.calls[key] == 0 and int(sample) == 0:
                self.asked.append(task_id)
            turns = self.mixture.env_for(task).oracle_turns(task)
            family = self.mixture.env_for(task).task_family(task)
            plays_oracle = family == "count" or (family == "lookup" and int(sample) % 2 == 0)
            replies = turns if plays_oracle else turns[-1:]  # the last oracle turn submits
            reply = replies[min(self.calls[key], len(replies) - 1)]
            self.calls[key] += 1
            tokens = tuple(ord(char) for char in reply + "\n")
            completions.append(Completion(key, int(sample), reply, tuple(ord(char) for char in context), tokens,
                                          (-0.5,) * len(tokens), "stop", 0))
        return GenerateResult(completions, 0)


@pytest.mark.bwrap
def test_agent_groups_without_signal_are_set_apart_and_fresh_tasks_drawn(tmp_path: Path) -> None:
    require_bwrap()
    from rlpipe.sandbox.bwrap import BwrapSandbox
    from rlpipe.sandbox.pool import SandboxPool

    config = load_config(None, [
        "envs.domains={agent_tasks = 1.0}", 'envs.agent_families=["lookup", "count", "sum", "which_file", "two_step"]',
        "envs.train_size=200", "model.max_position_embeddings=1024", "rollout.dynamic_sampling=true", f"rollout.max_extra_rounds={EXTRA_ROUNDS}",
        f"rollout.prompts_per_step={WANTED}", f"rollout.group_size={GROUP}", "rollout.max_new_tokens=80",
        f'storage.lake_uri="{tmp_path / "lake"}"',
    ])
    mixture = RecordingMixture(build_mixture(config))
    engine = FamilyScriptedEngine(mixture)
    lake = build_lake(config)
    with SandboxPool(lambda: BwrapSandbox(Limits(timeout_s=10.0)), size=4) as pool:
        workers = Workers(engine=engine, trainer=None, socket_folder=tmp_path, weights_folder=tmp_path, sandbox_pool=pool)
        runtime = Runtime("ds", config, mixture, [], workers, RunRecords(lake=lake, tracker=None))
        runtime.progress.engine_version = 0  # the scripted engine holds policy version 0, which step 1 needs
        trained_rows = rollout.fn(runtime, 1)

    manifest = lake.read_manifest("ds", 1)
    metrics = dict(manifest.metrics)
    trained = lake.read_parts(manifest.parts)
    set_apart = lake.read_parts(manifest.set_apart)
    assert trained_rows == manifest.rows == len(trained)

    def groups(rows):
        by_task = defaultdict(list)
        for row in rows:
            by_task[row.task.task_id].append(row)
        return by_task

    kept, apart = groups(trained), groups(set_apart)
    every = {**kept, **apart}
    assert not set(kept) & set(apart) and set(every) == set(engine.asked)  # each episode group stored once
    assert all(len(group) == GROUP for group in every.values())
    family = {task_id: mixture.env_for(rows[0].task).task_family(rows[0].task) for task_id, rows in every.items()}
    # every episode was judged by its verifier in its sandbox, as the script meant it to end
    for task_id, rows in every.items():
        for row in rows:
            passed = family[task_id] == "count" or (family[task_id] == "lookup" and row.completion.sample_idx % 2 == 0)
            assert row.verdict.reward == (1.0 if passed else 0.0), (family[task_id], row.completion.text)
    with_signal = {task_id for task_id, rows in every.items() if len({row.verdict.reward for row in rows}) > 1}
    assert with_signal == {task_id for task_id in every if family[task_id] == "lookup"}
    # the trained batch: only groups with signal, as many as wanted when the rounds found them
    assert set(kept) <= with_signal and len(kept) == min(WANTED, len(with_signal))
    assert all(row.advantage is not None and row.advantage != 0.0 for row in trained)
    # rounds: round 0 is WANTED tasks; another round only while too few groups had signal, at most EXTRA_ROUNDS
    rounds = int(metrics["dynamic/rounds"])
    assert 1 < rounds <= 1 + EXTRA_ROUNDS
    assert metrics["dynamic/groups_generated"] == len(every) and metrics["dynamic/groups_trained"] == len(kept)
    # round 0 drew WANTED tasks with too few groups with signal (this seed's draw; the scenario the
    # test is about), so fresh tasks were drawn, none of them twice, until the batch was full
    assert sum(task_id in with_signal for task_id in engine.asked[:WANTED]) < WANTED
    assert len(engine.asked) == len(set(engine.asked)) > WANTED
    if rounds < 1 + EXTRA_ROUNDS:
        assert len(with_signal) >= WANTED  # it stopped before its last round only with a full batch
