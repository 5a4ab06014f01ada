"""`rlpipe eval replay TRIAL --from-step K --agent A`: go on from step K of a recorded trial with another agent.

The state after step K is restored by re-executing the trial's recorded calls 1..K in a fresh
sandbox (agents/tree_state.py says why, and how each step's /work digest is checked); the new
agent continues, and the result is a new one-task eval (`--eval-id`, default
`replay-...`) whose trial row names the source (`replay_of`, `replay_from_step`). The trial
runs in this process (agents.evaluation.run_eval: infrastructure failures are retried from the
task's initial state, each attempt committed to the lake), not in the rl-eval flow, and is
not tracked in MLflow. Exit 0 when the trial ran; 2 for bad input: an unknown trial, K out
of range or past the trial's submit, a replayed step whose /work differs from the recorded
one (nothing is recorded then; the replay eval's EVAL.json stays, with no trial).
"""

from __future__ import annotations

import json
import secrets
import time
from pathlib import Path
from typing import Optional

import typer

from rlpipe.agents.evaluation import DEFAULT_MAX_ATTEMPTS, agent_factory, check_agent_name, run_eval, start_eval
from rlpipe.agents.policy import policy_agent_factory
from rlpipe.agents.replay import load_replay
from rlpipe.agents.trial import TrialOptions
from rlpipe.cli import agent_options
from rlpipe.cli.consoles import literal, stdout_console
from rlpipe.cli.sandbox import Backend
from rlpipe.core.config import StorageConfig
from rlpipe.core.errors import LakeNotFoundError
from rlpipe.storage.eval_records import task_key
from rlpipe.storage.evals import EvalStore
from rlpipe.storage.filesystem import open_lake_location
from rlpipe.storage.lake import Lake

console = stdout_console()


def replay_command(
    trial: str = typer.Argument(..., help="The recorded trial: EVAL_ID/TASK/ATTEMPT (eval_trials.trial_id)."),
    from_step: int = typer.Option(..., "--from-step", help="Re-execute the trial's first K steps, then hand over (0 = "
                                  "the initial state)."),
    agent: str = typer.Option(..., "--agent", help="The agent that goes on: oracle, noop or policy."),
    backend: Optional[Backend] = typer.Option(None, "--backend", help="Sandbox backend (default: the source trial's)."),
    lake: str = typer.Option(StorageConfig().lake_uri, "--lake", help="The lake holding the trial; the replay is committed there too."),
    eval_id: Optional[str] = typer.Option(None, "--eval-id", help="Id of the replay's eval (default: generated)."),
    command_timeout_s: float = typer.Option(120.0, "--command-timeout-s", help="Longest single bash call."),
    max_attempts: int = typer.Option(DEFAULT_MAX_ATTEMPTS, "--max-attempts", help="Attempts when the trial fails on "
                                     "infrastructure."),
    json_out: bool = typer.Option(False, "--json", help="Print the result as one JSON object."),
    policy: Optional[Path] = agent_options.POLICY,
    gguf: Optional[Path] = agent_options.GGUF,
    engine: agent_options.EngineName = agent_options.ENGINE,
    openai_base_url: Optional[str] = agent_options.OPENAI_BASE_URL,
    openai_model: Optional[str] = agent_options.OPENAI_MODEL,
    config: Optional[Path] = agent_options.RUN_CONFIG,
    device: Optional[str] = agent_options.DEVICE,
    temperature: float = agent_options.TEMPERATURE,
    top_p: float = agent_options.TOP_P,
    max_new_tokens: int = agent_options.MAX_NEW_TOKENS,
    seed: int = agent_options.SEED,
    context_tokens: int = agent_options.CONTEXT_TOKENS,
    episode_tokens: Optional[int] = agent_options.EPISODE_TOKENS,
    max_observation_chars: int = agent_options.MAX_OBSERVATION_CHARS,
    system_prompt: str = agent_options.SYSTEM_PROMPT,
) -> None:
    """Restore the state after step K of a recorded trial and continue it with another agent."""
    check_agent_name(agent)
    chosen = agent_options.policy_options(agent, policy, gguf, engine, openai_base_url, openai_model, config, device,
                                          temperature, top_p, max_new_tokens, seed, context_tokens, episode_tokens,
                                          max_observation_chars, system_prompt=system_prompt)
    try:
        store = EvalStore(Lake(open_lake_location(lake, create=False)))
    except LakeNotFoundError as exc:
        raise LakeNotFoundError(exc.message, hint="point --lake at the lake the trial was committed to") from None
    source = load_replay(store, trial, from_step)
    backend_name = backend.value if backend else source.info.backend
    options = TrialOptions(command_timeout_s=command_timeout_s)
    new_id = eval_id or f"replay-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"
    engine_handle = None
    if chosen is not None:
        from rlpipe.controller.eval_policy import open_policy_engine

        engine_handle = open_policy_engine(chosen, new_id)
        factory = policy_agent_factory(engine_handle, chosen.context(), chosen.system_override())
    else:
        factory = agent_factory(agent)
    try:
        recorder = start_eval(store, new_id, agent, backend_name, Path(source.info.tasks_dir) if source.info.tasks_dir else None,
                              [source.task], options, max_attempts, agent_options=chosen.to_dict() if chosen else None,
                              replay_of=trial, replay_from_step=from_step)
        report = run_eval([source.task], agent, backend_name, 1, options, max_attempts, recorder, factory, source.prefix)
    finally:
        if engine_handle is not None:
            engine_handle.close()
    result = report.trials[0]
    attempts = report.attempts[source.task.task_id]
    new_trial = f"{new_id}/{task_key(result.task_id)}/{attempts[-1].attempt}"
    if json_out:
        typer.echo(json.dumps({"eval_id": new_id, "trial_id": new_trial, "replay_of": trial, "replay_from_step": from_step,
                               "agent": agent, "backend": backend_name, "verdict": result.verdict.value,
                               "ending": result.ending.value, "reward": result.reward, "steps": len(result.steps),
                               "attempts": len(attempts), "detail": result.detail}))
        return
    console.print(f"replay of {literal(trial)} from step {from_step} (of {source.recorded_steps}) with agent {agent}: "
                  f"[bold]{result.verdict.value}[/] (ending {result.ending.value}, reward "
                  f"{'-' if result.reward is None else f'{result.reward:g}'}, {len(result.steps)} steps)", soft_wrap=True)
    if result.detail.strip():
        console.print(literal(result.detail.strip().splitlines()[-1][:200]), soft_wrap=True)
    console.print(f"trial {literal(new_trial)}  lake {literal(store.uri)}", soft_wrap=True)
