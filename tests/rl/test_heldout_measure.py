"""What a held-out evaluation measures (controller/evaluation.py `greedy_accuracy`) does not
depend on how the engine worker batches and prefills it: the engine's fast paths (batches of
rollout.batch_size, each distinct prompt once, the prompts' common prefix once, finished rows
dropped) give the figures, strict and format-free per domain, that the plainest greedy decode
gives (one prompt at a time, no sharing, no padding); and the evaluation asks the engine for
each task once, greedily, with the run's max_new_tokens and stop strings; with
eval.engine_dtype / eval.batch_size it asks for them and measures what an engine built in that
dtype and batch size measures."""

import dataclasses

import torch

from rlpipe.controller.evaluation import greedy_accuracy, heldout_tasks
from rlpipe.controller.runtime import Runtime, Workers
from rlpipe.controller.sample import build_mixture
from rlpipe.core.config import load_config
from rlpipe.core.records import VerifierSpec
from rlpipe.engines.hf import MIN_COMMON_PREFIX_TOKENS, HFEngine, common_prefix_length
from rlpipe.engines.sampling import SamplingParams, encode_prompt
from rlpipe.envs.exact import EXACT_KIND
from rlpipe.workers.builders import build_tokenizer
from rlpipe.workers.protocol import GenerateResult
from tests.engines.test_hf_engine import count_forward_rows, opinionated_model

OVERRIDES = ["envs.domains={arithmetic_chat_equation = 0.5, arithmetic = 0.5}", "envs.heldout_size=12",
             "rollout.max_new_tokens=10", "rollout.batch_size=5"]


class ServedEngine:
    """The engine worker's Generate served in-process (the protocol of EngineClient.generate),
    recording each request."""

    def __init__(self, engine: HFEngine) -> None:
        self.engine = engine
        self.requests: list[tuple[list[tuple[str, str]], object]] = []
        self.options: list[dict] = []

    def generate(self, prompts, params, **options) -> GenerateResult:
        self.requests.append((list(prompts), params))
        self.options.append(options)
        engine = self.engine.with_settings(**options) if options else self.engine  # as workers/engine_worker.py does
        return GenerateResult(engine.generate(list(prompts), params), self.engine.policy_version)


def evaluate_with(engine: HFEngine, config, mixture, tasks, tmp_path):
    served = ServedEngine(engine)
    workers = Workers(engine=served, trainer=None, socket_folder=tmp_path, weights_folder=tmp_path)
    runtime = Runtime("r", config, mixture, tasks, workers, records=None)  # an evaluation reads no records
    return greedy_accuracy(runtime, tasks), served.requests, served.options


def test_the_engines_fast_paths_measure_what_the_plainest_decode_measures(tmp_path):
    torch.set_num_threads(2)
    config = load_config(None, OVERRIDES)
    mixture = build_mixture(config)
    tokenizer = build_tokenizer(config)
    model = opinionated_model(len(tokenizer), seed=0)
    shapes = count_forward_rows(model)
    plainest = HFEngine(model, tokenizer, batch_size=1, prefix_sharing=False, drop_finished_rows=False,
                        common_prefix_sharing=False)
    fast = HFEngine(model, tokenizer, batch_size=config.rollout.batch_size)
    heldout = heldout_tasks(config, mixture)
    chat = [task for task in heldout if task.domain == "arithmetic_chat_equation"]
    # the untrained model answers no sum: so that strict accuracy can move, one exact-match task per
    # chat prompt expects the reply the plainest decode gives to it (a changed reply fails it)
    replies = {c.task_id: c.text for c in plainest.generate([(t.task_id, t.prompt) for t in chat], _greedy(config))}
    own_reply = [dataclasses.replace(task, task_id=f"own-{task.task_id}", domain="arithmetic",
                                     verifier=VerifierSpec(EXACT_KIND, replies[task.task_id].strip()))
                 for task in chat]
    tasks = chat + own_reply + [task for task in heldout if task.domain == "arithmetic"]  # numeric answers: format-free

    reference, _, _ = evaluate_with(plainest, config, mixture, tasks, tmp_path)
    shapes.clear()
    figures, requests, options = evaluate_with(fast, config, mixture, tasks, tmp_path)

    assert figures == reference
    assert reference["n/arithmetic_chat_equation"] == len(chat) and reference["n/arithmetic"] == 2 * len(chat)
    assert reference["accuracy/arithmetic"] >= 0.5  # every own-reply task passes
    assert "format_free/arithmetic" in reference
    assert len(set(replies.values())) > 2  # the prompts lead to different replies
    common = common_prefix_length([encode_prompt(tokenizer, task.prompt) for task in chat])  # "What is "
    assert common >= MIN_COMMON_PREFIX_TOKENS and (1, common) in shapes  # the fast path prefilled it once per batch
    [(prompts, params)] = requests
    assert prompts == [(task.task_id, task.prompt) for task in tasks]
    assert params == _greedy(config) and options == [{}]  # the engine's own dtype and batching


def test_an_evaluation_in_its_own_dtype_and_batch_measures_an_engine_built_so(tmp_path):
    torch.set_num_threads(2)
    config = load_config(None, [*OVERRIDES, 'eval.engine_dtype="bfloat16"', "eval.batch_size=7"])
    mixture = build_mixture(config)
    tokenizer = build_tokenizer(config)
    model = opinionated_model(len(tokenizer), seed=0)
    tasks = heldout_tasks(config, mixture)
    figures, _, options = evaluate_with(HFEngine(model, tokenizer, batch_size=config.rollout.batch_size), config, mixture,
                                        tasks, tmp_path)
    assert options == [{"dtype": "bfloat16", "batch_size": 7}]
    built_so = HFEngine(model, tokenizer, batch_size=7, dtype="bfloat16")
    plain_config = load_config(None, OVERRIDES)
    assert figures == evaluate_with(built_so, plain_config, mixture, tasks, tmp_path)[0]


def _greedy(config):
    return SamplingParams(n=1, max_new_tokens=config.rollout.max_new_tokens, stop=config.rollout.stop, seed=0, greedy=True)
