"""TRL's side of the SmolLM2 race (benchmarks/race_smollm2.py runs it as a subprocess, so
that its memory is its own process's): TRL's GRPOTrainer on an rlpipe recipe's model,
prompts, reward and settings, with held-out evaluations by rlpipe's evaluator.

    python benchmarks/race_trl_side.py CONFIG --out RESULT.json --budget-s S [--set KEY=VALUE ...]

From the recipe (CONFIG with the `--set` overrides, as `rlpipe train` reads it):
- weights: the same HF folder (model.gguf's converted folder, or model.path);
- prompts: step k's tasks are those `rlpipe train` draws for step k (the mixture's
  sample(prompts_per_step, derive_seed(seed, k, "sample"))), in that order, TRL's sampler not
  shuffled, so both sides train on the same prompts step by step; rendered through the chat
  template (conversational prompts: TRL applies the tokenizer's template, checked to give the
  ids rlpipe's engines feed) or as plain text;
- reward: the domain's own verifier (env.verify) on the reply cut at the first stop string;
- settings: group size, T, top_p, top_k off, max new tokens, lr constant, weight decay, grad
  clip, clip range (both sides), KL coefficient, micro- and mini-batches per RL step, group
  std-normalised advantages, token-mean loss ("dapo"). Where they differ: TRL has no stop
  strings, so every token whose text holds a stop string is made an end-of-sequence token
  (generation stops on it and it is the last trained token, as rlpipe's stop does); TRL
  recomputes the old logprobs with an extra forward pass, rlpipe takes the engine's.
- evaluation: greedy, rlpipe's HFEngine on a copy of the weights in eval.engine_dtype at
  eval.batch_size, the held-out tasks of `rlpipe train` (envs.heldout_seed), strict (the
  verifier) and format-free (envs/format_free.py) per domain: controller/evaluation.py's
  single-turn path. Before RL, then every eval.every_steps RL steps, the training clock
  stopped meanwhile; training stops at the first evaluation at or past `--budget-s` training
  seconds (or after `--max-steps` RL steps).

Writes RESULT.json: the epoch second training began (after the model load and the
evaluation before RL), each RL step's end in training seconds, and the evaluations
(step, training seconds, figures as greedy_accuracy names them), and how many RL steps
trained on other prompts than rlpipe's step of that number (0 unless TRL's sampler changes).
Not here: the race's
orchestration, memory, printing (race_smollm2.py).
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rlpipe.controller.evaluation import accuracy_figures, heldout_tasks  # noqa: E402
from rlpipe.controller.sample import build_mixture  # noqa: E402
from rlpipe.core.config import RunConfig, load_config  # noqa: E402
from rlpipe.core.seeds import derive_seed  # noqa: E402
from rlpipe.engines.hf import HFEngine, resolve_dtype  # noqa: E402
from rlpipe.engines.sampling import SamplingParams, encode_prompt  # noqa: E402
from rlpipe.envs.format_free import format_free_passed  # noqa: E402
from rlpipe.workers.builders import build_policy  # noqa: E402


def cut_at_stop(text: str, stops: tuple[str, ...]) -> str:
    """The reply as rlpipe's engines return it: up to the first stop string."""
    ends = [text.index(stop) for stop in stops if stop in text]
    return text[:min(ends)] if ends else text


def stop_token_ids(tokenizer, stops: tuple[str, ...]) -> list[int]:
    """Every token whose text holds a stop string (e.g. "\\n", ".\\n", "\\n\\n")."""
    return [i for i in range(len(tokenizer)) if any(stop in tokenizer.decode([i]) for stop in stops)]


def evaluate(model: torch.nn.Module, tokenizer, config: RunConfig, tasks: list, mixture) -> dict[str, float]:
    """Greedy pass@1 on `tasks` as `rlpipe train` evaluates (see the module docstring)."""
    target = resolve_dtype(config.eval.engine_dtype or "float32")
    cast = {id(p): torch.nn.Parameter(p.detach().to(target), requires_grad=False) for p in model.parameters()}
    engine = HFEngine(copy.deepcopy(model, cast).to(dtype=target), tokenizer, copy_model=False, dtype=target,
                      batch_size=config.eval.batch_size or config.rollout.batch_size, prompt_format=config.model.prompt_format)
    params = SamplingParams(n=1, temperature=1.0, top_p=1.0, max_new_tokens=config.rollout.max_new_tokens,
                            stop=config.rollout.stop, seed=0, greedy=True)
    completions = engine.generate([(t.task_id, t.prompt) for t in tasks], params)
    passed: dict[str, list[float]] = defaultdict(list)
    free: dict[str, list[float]] = defaultdict(list)
    for task, completion in zip(tasks, completions):
        passed[task.domain].append(1.0 if mixture.env_for(task).verify(task, completion.text).passed else 0.0)
        verdict = format_free_passed(task, completion.text)
        if verdict is not None:
            free[task.domain].append(1.0 if verdict else 0.0)
    return accuracy_figures(passed, free)


def grpo_args(config: RunConfig, output_dir: str, max_steps: int) -> dict:
    """GRPOConfig's arguments for the recipe's settings (one RL step = mini_batches_per_step
    optimizer steps of micro_batch_size completions, gradients accumulated to a mini-batch)."""
    rollout, train, algo = config.rollout, config.train, config.algo
    completions = rollout.prompts_per_step * rollout.group_size
    mini = completions // train.mini_batches_per_step
    micro = min(train.micro_batch_size, mini)
    if completions % train.mini_batches_per_step or mini % micro:
        raise ValueError(f"{completions} completions per step do not split into {train.mini_batches_per_step} mini-batches "
                         f"of whole micro-batches of {micro}")
    if algo.advantage != "grpo" or algo.loss_agg != "token_mean":
        raise ValueError("the race maps algo.advantage = grpo and algo.loss_agg = token_mean only")
    return dict(
        output_dir=output_dir, seed=config.seed, use_cpu=True, bf16=False, fp16=False, gradient_checkpointing=False,
        learning_rate=train.lr, lr_scheduler_type="constant", weight_decay=train.weight_decay, max_grad_norm=train.grad_clip,
        per_device_train_batch_size=micro, gradient_accumulation_steps=mini // micro,
        steps_per_generation=train.mini_batches_per_step * (mini // micro), num_generations=rollout.group_size,
        max_completion_length=rollout.max_new_tokens, temperature=rollout.temperature, top_p=rollout.top_p, top_k=0,
        epsilon=algo.clip_eps, epsilon_high=algo.clip_eps_high or algo.clip_eps, beta=algo.kl_coef, num_iterations=train.epochs_per_step, loss_type="dapo",
        scale_rewards="group", shuffle_dataset=False, max_steps=max_steps * train.mini_batches_per_step,
        logging_steps=10**9, save_strategy="no", report_to="none", disable_tqdm=True, dataloader_num_workers=0,
        remove_unused_columns=False,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("config", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--budget-s", type=float, required=True, help="training seconds (evaluations excluded)")
    parser.add_argument("--max-steps", type=int, default=0, help="> 0: stop after this many RL steps")
    parser.add_argument("--set", action="append", default=[], dest="overrides", metavar="KEY=VALUE")
    args = parser.parse_args()
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    config = load_config(args.config, args.overrides)
    mixture = build_mixture(config)
    heldout = heldout_tasks(config, mixture)
    rollout, every = config.rollout, config.eval.every_steps or 8
    steps = args.max_steps or int(args.budget_s) + 2 * every  # an RL step of this model takes seconds: never run out
    tasks = [t for k in range(1, steps + 1) for t in mixture.sample(rollout.prompts_per_step, rng_seed=derive_seed(config.seed, k, "sample"))]
    by_id = {t.task_id: t for t in tasks}
    torch.manual_seed(config.seed)
    model, tokenizer = build_policy(config)
    chat = config.model.prompt_format == "chat"
    prompts = [[{"role": "user", "content": t.prompt}] if chat else t.prompt for t in tasks]
    if chat:  # TRL renders the template itself: it must give the ids rlpipe's engines feed
        ids = tokenizer.apply_chat_template(prompts[0], add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]
        if tuple(ids) != encode_prompt(tokenizer, tasks[0].prompt, "chat"):
            raise SystemExit("error: TRL's rendering of the chat prompt differs from rlpipe's encode_prompt")
    model.generation_config.eos_token_id = [tokenizer.eos_token_id, *stop_token_ids(tokenizer, rollout.stop)]
    result: dict = {"evaluations": [], "step_ends_s": [], "max_steps": steps, "steps_off_rlpipe_prompts": 0}
    started = time.perf_counter()
    result["evaluations"].append({"step": 0, "train_s": 0.0, "figures": evaluate(model, tokenizer, config, heldout, mixture)})
    result["before_eval_s"] = time.perf_counter() - started

    class Race(TrainerCallback):
        """The training clock (evaluations excluded), the evaluations and the stop."""

        def on_train_begin(self, args_, state, control, **kwargs):
            self.started, self.paused = time.perf_counter(), 0.0
            result["train_started_at"] = time.time()

        def on_step_end(self, args_, state, control, **kwargs):
            if state.global_step % config.train.mini_batches_per_step:
                return
            step = state.global_step // config.train.mini_batches_per_step
            at = time.perf_counter() - self.started - self.paused
            result["step_ends_s"].append(at)
            if step % every == 0 or step == steps:
                before = time.perf_counter()
                figures = evaluate(kwargs["model"], tokenizer, config, heldout, mixture)
                self.paused += time.perf_counter() - before
                result["evaluations"].append({"step": step, "train_s": at, "figures": figures})
                args.out.write_text(json.dumps(result))  # what is done survives a kill
                if at >= args.budget_s:
                    control.should_training_stop = True

    def reward(prompts, completions, task_id, **kwargs):
        drawn = len(result["step_ends_s"]) * rollout.prompts_per_step  # this RL step's tasks, as `rlpipe train` draws them
        if set(task_id) != {t.task_id for t in tasks[drawn:drawn + rollout.prompts_per_step]}:
            result["steps_off_rlpipe_prompts"] = result.get("steps_off_rlpipe_prompts", 0) + 1
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        return [mixture.env_for(by_id[i]).verify(by_id[i], cut_at_stop(text, rollout.stop)).reward for text, i in zip(texts, task_id)]

    dataset = Dataset.from_dict({"prompt": prompts, "task_id": [t.task_id for t in tasks]})
    trainer = GRPOTrainer(model=model, reward_funcs=reward, args=GRPOConfig(**grpo_args(config, str(args.out.parent / "trl-output"), steps)),
                          train_dataset=dataset, processing_class=tokenizer, callbacks=[Race()])
    trainer.train()
    args.out.write_text(json.dumps(result))


if __name__ == "__main__":
    main()
