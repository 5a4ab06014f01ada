"""The policy agent's options of `rlpipe eval` and `rlpipe eval replay` (one definition for both).

    --agent policy --gguf models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
    --agent policy --policy rlpipe-lake/checkpoints/RUN/step=000020 --engine vllm
    --agent policy --engine openai --openai-base-url http://127.0.0.1:8000/v1 --openai-model NAME --policy DIR

`policy_options(...)` checks them (a model given exactly once, files that exist; any of them
with another agent is bad input) and returns agents.policy.PolicyOptions with absolute paths,
which EVAL.json records so that a resume builds the same agent.
"""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Optional

import typer

from rlpipe.agents.policy import POLICY_AGENT, SYSTEM_PROMPTS, PolicyOptions
from rlpipe.core.errors import ConfigError, ModelNotFoundError


class EngineName(str, Enum):
    hf = "hf"
    vllm = "vllm"
    openai = "openai"


POLICY = typer.Option(None, "--policy", help="Policy agent: an HF model folder (e.g. a checkpoint's step folder, rlpipe-lake/checkpoints/RUN/step=000020).")
GGUF = typer.Option(None, "--gguf", help="Policy agent: a GGUF file (SmolLM2: `make smollm2`), converted once beside it.")
ENGINE = typer.Option(EngineName.hf, "--engine", help="Policy agent: the engine (in the engine worker).")
OPENAI_BASE_URL = typer.Option(None, "--openai-base-url", help="Policy agent, --engine openai: the server's URL; "
                               "--policy/--gguf then give the tokenizer (chat template).")
OPENAI_MODEL = typer.Option(None, "--openai-model", help="Policy agent, --engine openai: the served model's name.")
RUN_CONFIG = typer.Option(None, "--config", help="Policy agent: a run config TOML whose \\[model] and \\[rollout] tables "
                          "the engine worker starts from (device, dtype, engine_python, ...).")
DEVICE = typer.Option(None, "--device", help="Policy agent: cpu, cuda, cuda:N or auto (default: --config's "
                      "model.device, else auto: cuda when there is one).")
TEMPERATURE = typer.Option(0.0, "--temperature", help="Policy agent: sampling temperature; 0 = greedy.")
TOP_P = typer.Option(1.0, "--top-p", help="Policy agent: nucleus mass.")
MAX_NEW_TOKENS = typer.Option(256, "--max-new-tokens", help="Policy agent: longest reply, in tokens.")
SEED = typer.Option(0, "--seed", help="Policy agent: sampling seed.")
CONTEXT_TOKENS = typer.Option(4096, "--context-tokens", help="Policy agent: the window (prompt + --max-new-tokens); "
                              "the oldest turns are dropped when it fills.")
EPISODE_TOKENS = typer.Option(None, "--episode-tokens", help="Policy agent: token budget of an episode (prompt + "
                              "generated tokens over its turns); the trial ends context_exhausted when spent. Default: none.")
MAX_OBSERVATION_CHARS = typer.Option(2000, "--max-observation-chars", help="Policy agent: tool results longer than "
                                     "this are cut in the middle (head and tail kept) in the prompt.")
SYSTEM_PROMPT = typer.Option("suite", "--system-prompt", help=f"Policy agent: {' or '.join(SYSTEM_PROMPTS)}; suite is the "
                             "loop's prompt with the tools' schemas, training the short prompt of agent_tasks chat "
                             "episodes (a policy trained by configs/smollm2_agent.toml learned that one).")


def policy_options(agent: Optional[str], policy: Optional[Path], gguf: Optional[Path], engine: EngineName,
                   openai_base_url: Optional[str], openai_model: Optional[str], config: Optional[Path], device: Optional[str],
                   temperature: float, top_p: float, max_new_tokens: int, seed: int, context_tokens: int,
                   episode_tokens: Optional[int], max_observation_chars: int, system_prompt: str = "suite") -> PolicyOptions | None:
    """PolicyOptions for --agent policy; None for another agent (which must get none of them)."""
    if agent != POLICY_AGENT:
        given = [flag for flag, value in (("--policy", policy), ("--gguf", gguf), ("--openai-base-url", openai_base_url),
                                          ("--openai-model", openai_model), ("--config", config), ("--device", device),
                                          ("--episode-tokens", episode_tokens)) if value is not None]
        if system_prompt != "suite":
            given.append("--system-prompt")
        if engine is not EngineName.hf:
            given.append("--engine")
        if given and agent is None:  # --resume: the eval's own agent options
            raise ConfigError(f"--resume goes on with the agent options recorded in EVAL.json, not {', '.join(given)}",
                              hint="drop them, or start a new eval")
        if given:
            raise ConfigError(f"{', '.join(given)} are options of the policy agent, not of --agent {agent}",
                              hint="add --agent policy, or drop them")
        return None
    if policy is not None and not (policy / "config.json").is_file():
        raise ModelNotFoundError(f"--policy {policy} is not an HF model folder (no config.json there)",
                                 hint="pass a folder written by save_pretrained, e.g. a checkpoint's step folder, rlpipe-lake/checkpoints/RUN/step=000020")
    if gguf is not None and not gguf.is_file():
        raise ModelNotFoundError(f"--gguf {gguf}: no such file", hint="`make smollm2` fetches models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
    if config is not None and not config.is_file():
        raise ConfigError(f"--config {config}: no such file", hint="pass a run config TOML, e.g. configs/smollm2.toml")
    return PolicyOptions(
        engine=engine.value, policy=str(policy.resolve()) if policy else None, gguf=str(gguf.resolve()) if gguf else None,
        openai_base_url=openai_base_url, openai_model=openai_model, config=str(config.resolve()) if config else None,
        device=device, temperature=temperature, top_p=top_p, max_new_tokens=max_new_tokens, seed=seed,
        context_tokens=context_tokens, episode_tokens=episode_tokens, max_observation_chars=max_observation_chars,
        system_prompt=system_prompt)
