"""The race: rlpipe's GRPO beside TRL's GRPOTrainer at an equal training time budget.

    .venv/bin/python benchmarks/vs_trl.py [--seconds 240] [--repeats 2] [--threads 1] [--lr 1e-3] [--clock wall|cpu]
        [--sizes 8x8,128x8] [--eval-every 60] [--dynamic-sampling on|off]
    .venv/bin/python benchmarks/vs_trl.py --steps 20 --systems rlpipe,trl,cli [--init DIR] [--cli-checkout main=/work/main]
    (needs the `bench` extra: pip install -e .[bench], i.e. trl)

One invocation: builds the quickstart's warm-start checkpoint ONCE (configs/quickstart.toml,
seed 0: the tiny Qwen2 model, the char tokenizer, supervised steps until greedy accuracy on
training tasks reaches the target), then, for each repeat seed, trains a copy of it with
rlpipe and with trl.GRPOTrainer on the same task (reverse words, the same training split),
with the same settings: 128 prompts x 8 samples per step, T = 0.7, top_p 1, top_k off, at
most 6 new tokens (both stop at the EOS the warm-start taught), AdamW lr 1e-3 (`--lr`; the
race's setting, whatever quickstart.toml says) constant, grad clip 1, 4 optimizer steps per
batch (mini-batches of 256 completions), clip 0.2, no KL, token-mean loss, group
std-normalised advantages (sample std in both), logprobs at the sampling temperature in
both, the env's exact-match verifier as reward. Each trains until `--seconds` of training
time have passed (checked after each RL step, i.e. each 4 optimizer steps, for both); then
one evaluator scores both: rlpipe's HFEngine, greedy, on the quickstart's held-out tasks.

The runs interleave (repeat 0: rlpipe then TRL; repeat 1: TRL then rlpipe; ...), so a load
that drifts over the invocation falls on both sides alike. `--clock wall` (default, the
issue's "equal training wall time") counts wall seconds; `--clock cpu` counts the process's
CPU seconds instead, which other jobs on a shared machine do not inflate. Each row prints
both, and the load average before and after the invocation.

What "rlpipe" means here: the library loop of one RL step (engine -> verifier -> group
advantages -> Trainer.update with seeded shuffled mini-batches -> weight sync), with the
quickstart's dynamic sampling (`--dynamic-sampling on`, the default: up to 2 extra rounds
per step until 128 groups have rewards that differ, only those trained; TRL's GRPOTrainer
has no such option, so `off` is the like-for-like loop), the same calls the train flow's
stages make, WITHOUT the Prefect orchestration and the lake writes
(the flow adds those per step; see benchmarks/step_breakdown.py). TRL runs its own loop
(model.generate, its loss with the fused LM head) on the same CPU threads.

`--steps N` times steps instead of racing: per repeat each system runs N RL steps from the
same policy (the order rotating); each run's median seconds per step after the first, and
its stages' medians (the CLI's `time/<stage>_s`, the loop's timed under the same names),
are printed with the ratios of `rlpipe train` (system `cli`, benchmarks/cli_steps.py: the
command as a user runs it, Prefect, lake, MLflow and workers included, timed from its step
commits) to the loop and to TRL, repeat by repeat. `--init DIR` starts every system from a
model folder (e.g. a run's checkpoint step=000000) instead of warm-starting here.

Prints, per size (`--sizes`, prompts x group per step; the settings above are the 128 x 8
case), one row per run (accuracy, RL steps, wall and CPU seconds per step, held-out accuracy
every `--eval-every` training seconds with the clocks stopped), the median and spread per
system, and the ratios. Nothing here asserts: numbers are for reading. Why TRL once looked
4x slower per step: docs/RESULTS.md, "Why TRL once looked 4x slower per step".
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # cli_steps, next to this file

import cli_steps  # noqa: E402
from race_budget import CLOCKS, Budget  # noqa: E402

from rlpipe.controller.sample import build_mixture  # noqa: E402
from rlpipe.controller.stage_clock import StageClock  # noqa: E402
from rlpipe.core.config import load_config  # noqa: E402
from rlpipe.core.seeds import derive_seed  # noqa: E402
from rlpipe.engines.hf import HFEngine  # noqa: E402
from rlpipe.engines.sampling import SamplingParams  # noqa: E402
from rlpipe.rl.advantages import group_advantages  # noqa: E402
from rlpipe.rl.batching import TrainSample  # noqa: E402
from rlpipe.rl.dynamic_sampling import extra_round_size  # noqa: E402
from rlpipe.rl.trainer import Trainer  # noqa: E402
from rlpipe.rl.warmstart import warm_start  # noqa: E402
from rlpipe.workers.builders import build_policy  # noqa: E402

QUICKSTART = Path(__file__).resolve().parents[1] / "configs" / "quickstart.toml"
class Setup:
    """The quickstart's config, mixture, held-out tasks and the warm-started policy (or the
    policy of `init`, a model folder such as a checkpoint's: no warm start then)."""

    def __init__(self, lr: float, prompts: int = 128, group: int = 8, init: Path | None = None) -> None:
        self.overrides = ["seed=0", f"train.lr={lr}", "train.mini_batches_per_step=4", "rollout.temperature=0.7",
                          "rollout.top_p=1.0", "rollout.max_new_tokens=6", "algo.clip_eps=0.2", "algo.kl_coef=0.0"]
        self.overrides += [f'model.path="{init.resolve()}"'] if init else []
        self.config = load_config(QUICKSTART, self.overrides + [f"rollout.prompts_per_step={prompts}", f"rollout.group_size={group}"])
        self.mixture = build_mixture(self.config)
        self.env = self.mixture.envs["reverse"]
        self.heldout = self.mixture.heldout(self.config.envs.heldout_size, seed=0)
        self.train_tasks = self.mixture.sample(self.config.envs.train_size, rng_seed=derive_seed(0, 0, "warmstart"))
        torch.manual_seed(0)
        self.policy, self.tokenizer = build_policy(self.config)
        self.warm_seconds = 0.0 if init else self._warm_start()

    def with_size(self, prompts: int, group: int) -> Setup:
        """The same warm-started policy and tasks, with prompts x group completions per step."""
        other = copy.copy(self)
        rollout = self.config.rollout.model_copy(update={"prompts_per_step": prompts, "group_size": group})
        other.config = self.config.model_copy(update={"rollout": rollout})
        return other

    def _warm_start(self) -> float:
        """What the train flow's warm-start stage does (tasks/lifecycle.py), timed."""
        config, started = self.config, time.perf_counter()
        examples = [(t.prompt, t.reference_answer) for t in self.train_tasks]
        check = self.mixture.sample(config.warmstart.check_tasks, rng_seed=derive_seed(0, 0, "warmstart-check"))
        warm_start(
            self.policy, self.tokenizer, examples, steps=config.warmstart.steps, batch_size=config.warmstart.batch_size,
            lr=config.warmstart.lr, seed=derive_seed(0, 0, "warmstart-order"), check_every=config.warmstart.check_every_steps,
            stop_check=lambda _: self.accuracy(self.policy, check) >= config.warmstart.target_accuracy,
        )
        return time.perf_counter() - started

    def accuracy(self, model: torch.nn.Module, tasks: list | None = None) -> float:
        """Greedy pass@1 with rlpipe's engine and the env's verifier (the one evaluator)."""
        tasks = self.heldout if tasks is None else tasks
        params = SamplingParams(n=1, max_new_tokens=self.config.rollout.max_new_tokens, stop=self.config.rollout.stop, greedy=True)
        engine = HFEngine(model, self.tokenizer, batch_size=self.config.rollout.batch_size)
        completions = engine.generate([(t.task_id, t.prompt) for t in tasks], params)
        return sum(self.env.verify(t, c.text).passed for t, c in zip(tasks, completions)) / len(tasks)


def race_rlpipe(setup: Setup, seed: int, budget: Budget, dynamic_sampling: bool) -> tuple[torch.nn.Module, int]:
    """rlpipe's RL steps until the budget is spent; returns (model, RL steps). With
    `dynamic_sampling` (the quickstart's recipe) a step generates up to 1 + max_extra_rounds
    rounds, as the train flow does (tasks/step_tasks.py, rl/dynamic_sampling.py), and trains
    the first prompts_per_step groups whose rewards differ."""
    config, rollout = setup.config, setup.config.rollout
    model = copy.deepcopy(setup.policy)
    trainer = Trainer(
        model, lr=config.train.lr, grad_clip=config.train.grad_clip, micro_batch_size=config.train.micro_batch_size,
        mini_batches_per_step=config.train.mini_batches_per_step, clip_eps=config.algo.clip_eps, kl_coef=0.0,
        loss_agg=config.algo.loss_agg, temperature=rollout.temperature,
    )
    engine = HFEngine(model, setup.tokenizer, batch_size=rollout.batch_size)
    wanted, rounds = rollout.prompts_per_step, 1 + (rollout.max_extra_rounds if dynamic_sampling else 0)
    step = 0
    budget.start()
    while not budget.spent():
        step += 1
        clock = StageClock()  # the CLI's stage names and clock (controller/stage_clock.py)
        groups: list[list[tuple]] = []  # [(completion, reward)] per task, in round then task order
        seen: set[str] = set()
        for round_ in range(rounds):  # one round without dynamic sampling
            clock.enter("sample")
            with_signal = sum(1 for group in groups if _has_signal(group))
            if round_ and with_signal >= wanted:
                break
            count = wanted if round_ == 0 else extra_round_size(wanted - with_signal, with_signal, len(groups), cap=wanted)
            drawn = setup.mixture.sample(count + len(seen), rng_seed=derive_seed(seed, step, f"sample-round-{round_}"))
            tasks = list({t.task_id: t for t in drawn if t.task_id not in seen}.values())[:count]
            seen.update(t.task_id for t in tasks)
            params = SamplingParams(n=rollout.group_size, temperature=rollout.temperature, top_p=rollout.top_p,
                                    max_new_tokens=rollout.max_new_tokens, stop=rollout.stop,
                                    seed=derive_seed(seed, step, f"generate-round-{round_}"))
            clock.enter("generate")
            completions = engine.generate([(t.task_id, t.prompt) for t in tasks], params)
            clock.enter("verify")
            by_task = defaultdict(list)
            for task, completion in zip((t for t in tasks for _ in range(rollout.group_size)), completions):
                by_task[task.task_id].append((completion, setup.env.verify(task, completion.text).reward))
            groups.extend(by_task[t.task_id] for t in tasks)
        clock.enter("advantages")
        if dynamic_sampling:
            groups = [group for group in groups if _has_signal(group)][:wanted]
        samples = []
        for group in groups:
            for (completion, _), advantage in zip(group, group_advantages([reward for _, reward in group], config.algo.advantage)):
                samples.append(TrainSample(completion.prompt_token_ids, completion.token_ids, completion.logprobs, advantage))
        clock.enter("update")
        trainer.update(samples, shuffle_seed=derive_seed(seed, step, "mini-batches"))
        clock.enter("sync")
        engine.load_weights(trainer.named_weights(), step)
        budget.step_done(clock.timings())
        budget.checkpoint(model)
    return model, step


def _has_signal(group: list[tuple]) -> bool:
    """Rewards that differ within the group (else every GRPO advantage is 0)."""
    return len({reward for _, reward in group}) > 1


def race_trl(setup: Setup, seed: int, budget: Budget) -> tuple[torch.nn.Module, int]:
    """TRL's GRPOTrainer with the same settings until the budget is spent; returns (model, RL steps)."""
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    config, rollout = setup.config, setup.config.rollout
    mini_batch = rollout.prompts_per_step * rollout.group_size // config.train.mini_batches_per_step

    class Deadline(TrainerCallback):
        """Stops after the RL step (steps_per_generation optimizer steps) in which time ran out."""

        def __init__(self) -> None:
            self.steps = 0

        def on_train_begin(self, args, state, control, **kwargs):
            budget.start()

        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step % config.train.mini_batches_per_step == 0:
                self.steps = state.global_step // config.train.mini_batches_per_step
                budget.step_done()
                budget.checkpoint(kwargs["model"])
                if budget.spent():
                    control.should_training_stop = True

    by_id = {t.task_id: t for t in setup.train_tasks}

    def reward(prompts, completions, task_id, **kwargs):
        # the env's verifier; TRL stops on EOS only, rlpipe also at the stop string "\n": cut the same way
        return [setup.env.verify(by_id[i], c.split("\n")[0]).reward for c, i in zip(completions, task_id)]

    dataset = Dataset.from_dict({"prompt": [t.prompt for t in setup.train_tasks], "task_id": [t.task_id for t in setup.train_tasks]})
    args = GRPOConfig(
        output_dir=str(Path("/tmp") / f"vs_trl_{seed}"), seed=seed, use_cpu=True, bf16=False, fp16=False,
        gradient_checkpointing=False, learning_rate=config.train.lr, lr_scheduler_type="constant", weight_decay=0.0,
        max_grad_norm=config.train.grad_clip, per_device_train_batch_size=mini_batch, gradient_accumulation_steps=1,
        steps_per_generation=config.train.mini_batches_per_step, num_generations=rollout.group_size,
        max_completion_length=rollout.max_new_tokens, temperature=rollout.temperature, top_p=rollout.top_p,
        top_k=0, epsilon=config.algo.clip_eps, beta=0.0, num_iterations=1, loss_type="dapo", scale_rewards="group",
        max_steps=100_000, logging_steps=10_000, save_strategy="no", report_to="none", disable_tqdm=True,
        dataloader_num_workers=0, remove_unused_columns=False,
    )
    deadline = Deadline()
    trainer = GRPOTrainer(model=copy.deepcopy(setup.policy), reward_funcs=reward, args=args,
                          train_dataset=dataset, processing_class=setup.tokenizer, callbacks=[deadline])
    trainer.train()
    return trainer.model, deadline.steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=240.0, help="training time per run, on --clock")
    parser.add_argument("--repeats", type=int, default=2, help="runs per system (seeds 0..repeats-1)")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads(), help="torch CPU threads")
    parser.add_argument("--systems", default="rlpipe,trl", help="comma-separated: rlpipe, trl")
    parser.add_argument("--lr", type=float, default=1e-3, help="AdamW learning rate of both")
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="wall", help="what --seconds counts: wall or process CPU time")
    parser.add_argument("--sizes", default="8x8,128x8", help="comma-separated PROMPTSxGROUP completions per step")
    parser.add_argument("--dynamic-sampling", choices=("on", "off"), default="on",
                        help="rlpipe's dynamic sampling (on: the quickstart's recipe; TRL's GRPOTrainer has none)")
    parser.add_argument("--eval-every", type=float, default=60.0, help="training seconds between held-out points (0: end only)")
    parser.add_argument("--steps", type=int, default=0, help="> 1: time this many RL steps per run instead of a race (cli allowed)")
    parser.add_argument("--init", type=Path, help="start from this model folder (e.g. a run's checkpoint step=000000), no warm start")
    parser.add_argument("--cli-checkout", action="append", default=[], metavar="NAME=PATH",
                        help="--steps: also time `rlpipe train` of another checkout as system NAME (e.g. main=/work/main)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    load_before = os.getloadavg()
    base = Setup(args.lr, init=args.init)
    if args.steps > 1:
        return step_race(args, base)
    start_accuracy = base.accuracy(base.policy)
    print(f"warm start: {base.warm_seconds:.0f} s; held-out accuracy {start_accuracy:.3f} on {len(base.heldout)} tasks; "
          f"{args.seconds:.0f} {args.clock} s of training per run, lr {args.lr:g}, {args.threads} threads, "
          f"rlpipe's dynamic sampling {args.dynamic_sampling}; "
          f"load average {load_before[0]:.1f} (1 min), {load_before[1]:.1f} (5 min) at start", flush=True)
    dynamic = args.dynamic_sampling == "on"
    races = {"rlpipe": lambda *a: race_rlpipe(*a, dynamic_sampling=dynamic), "trl": race_trl}
    systems = args.systems.split(",")
    for size in args.sizes.split(","):
        prompts, group = (int(part) for part in size.lower().split("x"))
        setup = base.with_size(prompts, group)
        results: dict[str, list[float]] = defaultdict(list)
        per_step: dict[str, list[float]] = defaultdict(list)
        print(f"\n{prompts} x {group} completions per step")
        print(f"{'system':8} {'seed':>4} {'held-out':>9} {'steps':>6} {'wall s/step':>11} {'cpu s/step':>10} "
              f"{'wall s':>7} {'cpu s':>7} {'load':>5}  held-out at training seconds", flush=True)
        for seed in range(args.repeats):
            for system in systems if seed % 2 == 0 else systems[::-1]:  # alternate who runs first
                budget = Budget(args.seconds, args.clock, args.eval_every, setup.accuracy)
                model, steps = races[system](setup, seed, budget)
                wall, cpu = budget.used()
                accuracy = setup.accuracy(model)
                results[system].append(accuracy)
                per_step[system].append(wall / max(steps, 1))
                curve = " ".join(f"{at:.0f}s:{value:.3f}" for at, value in budget.curve)
                print(f"{system:8} {seed:>4} {accuracy:>9.3f} {steps:>6} {wall / max(steps, 1):>11.2f} {cpu / max(steps, 1):>10.2f} "
                      f"{wall:>7.0f} {cpu:>7.0f} {os.getloadavg()[1]:>5.1f}  {curve}", flush=True)
        for system, values in results.items():
            print(f"{size} {system}: held-out mean {statistics.mean(values):.3f}, spread {min(values):.3f}..{max(values):.3f} "
                  f"({len(values)} runs; start {start_accuracy:.3f}); wall s/step median {statistics.median(per_step[system]):.2f}")
        if len(per_step) == 2 and "rlpipe" in per_step and "trl" in per_step:
            ratio = statistics.median(per_step["rlpipe"]) / statistics.median(per_step["trl"])
            print(f"{size}: rlpipe's wall time per RL step is {ratio:.2f}x TRL's")
    load_after = os.getloadavg()
    print(f"load average at the end: {load_after[0]:.1f} (1 min), {load_after[1]:.1f} (5 min), {load_after[2]:.1f} (15 min)")


def step_race(args: argparse.Namespace, base: Setup) -> None:
    """`--steps N`: each system runs N RL steps per repeat from the same policy, the order
    rotating by repeat; prints each run's median seconds per step (after the first) and the
    ratios of the CLI's to the loop's and TRL's, repeat by repeat (same load) and overall."""
    checkouts = {"cli": cli_steps.REPO, **dict((name, Path(path)) for name, path in (c.split("=", 1) for c in args.cli_checkout))}
    systems = args.systems.split(",") + [name for name in checkouts if name != "cli"]
    dynamic = args.dynamic_sampling == "on"
    with tempfile.TemporaryDirectory(prefix="vs_trl_init_") as saved:
        init = args.init or Path(saved)
        if not args.init:  # the CLI starts from the race's warm-started policy
            base.policy.save_pretrained(saved)
            base.tokenizer.save_pretrained(saved)
        for size in args.sizes.split(","):
            prompts, group = (int(part) for part in size.lower().split("x"))
            setup = base.with_size(prompts, group)
            sets = base.overrides + [f'model.path="{init.resolve()}"', f"rollout.prompts_per_step={prompts}",
                                     f"rollout.group_size={group}", f"rollout.dynamic_sampling={str(dynamic).lower()}"]
            medians: dict[str, list[tuple[float, float]]] = defaultdict(list)
            print(f"\n{prompts} x {group} completions per step, {args.steps} RL steps per run, lr {args.lr:g}, "
                  f"dynamic sampling {args.dynamic_sampling}, {args.threads} threads")
            print(f"{'system':8} {'seed':>4} {'held-out':>9} {'wall s/step':>20} {'cpu s/step':>10} {'load':>5}  stages (median s)")
            for seed in range(args.repeats):
                for system in systems[seed % len(systems):] + systems[:seed % len(systems)]:  # rotate who goes first
                    if system in checkouts:
                        times = cli_steps.run_cli(sets + [f"seed={seed}"], args.steps, args.threads, checkouts[system])
                    else:
                        budget = Budget(float("inf"), "wall", steps=args.steps)
                        model, _ = (race_trl(setup, seed, budget) if system == "trl"
                                    else race_rlpipe(setup, seed, budget, dynamic_sampling=dynamic))
                        times = budget.periods()
                        times.accuracy = setup.accuracy(model)
                    wall, cpu = times.median()
                    medians[system].append((wall, cpu))
                    stages = " ".join(f"{name} {value:.3f}" for name, value in times.stages.items() if value >= 0.0005)
                    print(f"{system:8} {seed:>4} {times.accuracy:>9.3f} {wall:>7.3f} ({min(times.wall):.3f}-{max(times.wall):.3f}) "
                          f"{cpu:>10.3f} {os.getloadavg()[0]:>5.1f}  {stages}", flush=True)
            for system, values in medians.items():
                walls, cpus = [w for w, _ in values], [c for _, c in values]
                print(f"{size} {system}: wall s/step {statistics.median(walls):.3f} ({min(walls):.3f}-{max(walls):.3f}), "
                      f"cpu s/step {statistics.median(cpus):.3f} ({min(cpus):.3f}-{max(cpus):.3f}) over {len(values)} runs")
            for cli in (name for name in checkouts if name in medians):
                for other in (name for name in ("rlpipe", "trl") if name in medians):
                    for clock, index in (("wall", 0), ("cpu", 1)):
                        pairs = [a[index] / b[index] for a, b in zip(medians[cli], medians[other])]
                        print(f"{size}: {cli} / {'loop' if other == 'rlpipe' else other} per step ({clock}): median of the "
                              f"repeats {statistics.median(pairs):.2f} ({min(pairs):.2f}-{max(pairs):.2f})")
    load_after = os.getloadavg()
    print(f"load average at the end: {load_after[0]:.1f} (1 min), {load_after[1]:.1f} (5 min), {load_after[2]:.1f} (15 min)")


if __name__ == "__main__":
    main()
