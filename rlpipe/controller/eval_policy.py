"""The policy agent's engine for one eval: an engine worker behind agents.policy.ChatEngine.

`open_policy_engine(options, eval_id)` starts the engine worker of workers/engine_worker.py
(the process that holds the model: hf, vllm, or a client of an OpenAI-compatible server)
with a RunConfig made from the eval's PolicyOptions: the [model] and [rollout] tables of
`options.config` when given, then model.path / model.gguf / rollout.engine and the openai
settings from the options. The prompt format is forced to `plain`: the agent sends text
already rendered by the chat template (RenderChat), which a plain prompt encodes to the
same ids. It waits for the worker to be ready and renders one conversation, so a model
without a chat template is refused before any trial starts, and the model's load time is
never charged to a trial's time limit.

`WorkerChatEngine` is the ChatEngine: `render` -> EngineClient.render_chat, `generate` ->
EngineClient.generate of one prompt (n = 1; greedy at temperature 0). Calls are serialized
by the client, so concurrent trials take turns on the model. A worker that dies makes the
call raise EngineFailed: that trial is `engine_error` (infrastructure, retried), and the
next call starts a fresh worker.

The controller imports no torch: the model lives in the worker. What it does not do: batch
the turns of concurrent trials into one generate call.
"""

from __future__ import annotations

import dataclasses
import itertools
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from rlpipe.agents.policy import Generation, PolicyOptions, RenderedPrompt
from rlpipe.controller.preflight import engine_python
from rlpipe.core.config import RunConfig, load_config
from rlpipe.engines.sampling import SamplingParams
from rlpipe.workers.client import EngineClient, WorkerSpec


def policy_run_config(options: PolicyOptions) -> RunConfig:
    """The engine worker's RunConfig for these options."""
    base = load_config(options.config) if options.config else RunConfig()
    model = base.model.model_copy(update={"path": options.policy, "gguf": options.gguf, "prompt_format": "plain",
                                          "device": options.device or base.model.device})
    rollout = base.rollout.model_copy(update={"engine": options.engine, "openai_base_url": options.openai_base_url,
                                              "openai_model": options.openai_model, "batch_size": 1})
    return base.model_copy(update={"model": model, "rollout": rollout, "seed": options.seed})


def sampling_params(options: PolicyOptions) -> SamplingParams:
    greedy = options.temperature == 0
    return SamplingParams(n=1, temperature=1.0 if greedy else options.temperature, top_p=options.top_p,
                          max_new_tokens=options.max_new_tokens, seed=options.seed, greedy=greedy)


@dataclass
class WorkerChatEngine:
    """agents.policy.ChatEngine over an engine worker."""

    client: EngineClient
    params: SamplingParams
    folders: tuple[Path, ...] = ()
    _calls: itertools.count = field(default_factory=lambda: itertools.count(1))

    @property
    def max_new_tokens(self) -> int:
        return self.params.max_new_tokens

    def render(self, messages: tuple[tuple[str, str], ...]) -> RenderedPrompt:
        rendered = self.client.render_chat(messages)
        return RenderedPrompt(rendered.text, rendered.token_count)

    def generate(self, prompt: RenderedPrompt, task_id: str) -> Generation:
        # each call its own seed, so a sampled (temperature > 0) episode does not repeat one draw
        params = dataclasses.replace(self.params, seed=self.params.seed + next(self._calls))
        completion = self.client.generate([(task_id, prompt.text)], params).completions[0]
        return Generation(completion.text, len(completion.prompt_token_ids), len(completion.token_ids), completion.finish_reason)

    def close(self) -> None:
        try:
            self.client.stop()
        finally:
            for folder in self.folders:
                shutil.rmtree(folder, ignore_errors=True)


def open_policy_engine(options: PolicyOptions, eval_id: str) -> WorkerChatEngine:
    """Start the engine worker and wait until it renders a conversation (see the module doc)."""
    config = policy_run_config(options)
    socket_folder = Path(tempfile.mkdtemp(prefix="rlpipe-agent-w-"))
    weights = Path(tempfile.mkdtemp(prefix="rlpipe-agent-weights-"))
    spec = WorkerSpec(f"eval-{eval_id}", "engine", config.model_dump_json(), socket_folder, weights, {}, engine_python(config))
    engine = WorkerChatEngine(EngineClient(spec), sampling_params(options), (socket_folder, weights))
    try:
        engine.render((("system", "probe"), ("user", "probe")))
    except BaseException:
        engine.close()
        raise
    return engine
