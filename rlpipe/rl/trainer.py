"""The policy trainer: one clipped policy-gradient update per RL step, AdamW, grad clipping.

What it does: `update(samples, shuffle_seed)` shuffles the step's samples (a local
`random.Random(shuffle_seed)`, never the global RNG, so a replay on resume is bit-identical;
as TRL's GRPOTrainer does, so each optimizer step sees samples of most of the step's tasks
instead of a quarter of them), splits them into `mini_batches_per_step` mini-batches
(PPO-style; verl's ppo_mini_batch_size) and runs one optimizer step per mini-batch,
`epochs_per_step` times over (each epoch reshuffles, from the same seeded stream). Each optimizer step accumulates gradients over
micro-batches whose losses are normalised by the WHOLE mini-batch's token (token_mean) or
sequence (seq_mean_token_sum) count, so the accumulated gradient equals the mini-batch
gradient whatever the micro-batch size. Mini-batches after the first are slightly
off-policy; the clipped importance ratio against the stored sampling logprobs accounts for it.
New logprobs are computed at the sampling `temperature` (log_softmax(logits / T), the
convention of engines/base.py), so the ratio of an unchanged policy is 1.
Samples with advantage None are excluded entirely; samples with advantage 0.0 add nothing
to the policy-gradient term, so without a KL penalty they are skipped for speed, but still
count in the normaliser and in `tokens`. With kl_coef > 0 a frozen reference model is kept
(a deep copy of the initial model unless one is passed) and every scored sample trains; with
kl_coef == 0 there is no reference at all (`reference_model` is None, a passed one is dropped).

Devices and memory:
- `device` / `dtype` (None: where and what the model already is) move and cast the model;
  batches go to the model's device. The reference is a copy, so it has both too.
- bfloat16 weights train through float32 MASTER weights (rl/precision.py: AdamW with fp32
  moments steps fp32 copies, gradients accumulate in fp32, the bf16 weights are the master
  rounded after each step; pure bf16 AdamW would round small steps away). The masters are
  part of `state_dict()` (resume is exact, not re-derived from the rounded bf16 weights).
- AdamW is torch's fused kernel on CPU and CUDA (`fused=True`): one pass over each tensor
  with no temporaries (the default CPU kernel allocates two temporaries the size of each
  parameter in turn and is slower; the two agree to float rounding). The gradients are
  freed right after each optimizer step.
- `gradient_checkpointing`: the model recomputes each decoder layer's activations in the
  backward pass (transformers' non-reentrant checkpointing) and keeps no KV cache.
- `logprob_chunk_positions` > 0: the LM head's logits that many positions at a time,
  recomputed in the backward pass (rl/chunked_logprobs.py); 0: the model's own, all at once.
- `lora_rank > 0`: the model is wrapped with a LoRA adapter (rl/lora.py; `self.model` is then
  the peft model, which the caller uses for checkpoints): only the adapter has gradients and
  optimizer state, and `named_weights()` yields only the adapter's tensors.

Truncated importance sampling (`tis_cap` set; see losses.py): before the first optimizer
step the trainer computes its own logprobs of the samples it will train (no grad, the policy
version that the step starts from); they are the PPO ratio's denominator, and each token's
policy-gradient term is weighted by min(exp(trainer - engine), tis_cap). With one epoch and
no dropout, the first mini-batch's are its own update's forward pass, detached (the weights
have not moved yet): a single optimizer step needs no extra pass (`own_first_proximal=False`
takes them in the separate pass too, as a reference). `tis_cap` None keeps
the ratio against the engine's stored logprobs, exactly as before.

`policy_gradient(samples)`: the loss gradient of some samples, no `.grad` or weight touched.

`state_dict()` / `load_state_dict()` cover the optimizer (and the fp32 master weights); the
model's weights (or adapter) are saved by the caller (rl/checkpoint.py); `named_weights()`
yields the tensors to sync into a rollout engine. `state_dict()` holds the live tensors, which
a checkpoint may write in the background (workers/checkpoint_writer.py): the hook
`before_state_change` (no-op by default) runs before every in-place change of the weights,
masters or optimizer state (each optimizer step, after forward, backward and clipping).

Data parallel (`share`, rl/data_parallel.py; torchrun, workers/trainer_rank.py): every rank
holds the whole model and runs `update` on the same samples; rank r computes micro-batches
r, r+W, ... of each mini-batch, and one all-reduce SUM per optimizer step gives every rank
the single-process gradient and metrics, up to float rounding. `broadcast_state()` copies rank 0's weights and optimizer state to the others.

What it does not: sample, verify, compute advantages, save files, or shard the model.
"""

from __future__ import annotations

import copy
import dataclasses
import random
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from transformers import PreTrainedModel

from rlpipe.rl.data_parallel import RankShare, all_reduce_floats, all_reduce_gradients, broadcast_module, broadcast_object
from rlpipe.rl.batching import TrainSample, completion_tokens, micro_batches, pad_samples, token_logprobs
from rlpipe.rl.lora import adapter_named_parameters, apply_lora, is_lora_model
from rlpipe.rl.losses import LossAggregation, policy_loss
from rlpipe.rl.policy import resolve_device, resolve_dtype
from rlpipe.rl.precision import MasterWeights
from rlpipe.rl.update_metrics import TisUpdateMetrics, UpdateMetrics

__all__ = ["Trainer", "TrainSample", "UpdateMetrics", "TisUpdateMetrics", "DEFAULT_LORA_TARGETS"]

DEFAULT_LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
MASTER_WEIGHTS_KEY = "rlpipe_fp32_master_weights"
FUSED_ADAMW_DEVICES = ("cpu", "cuda")  # torch's fused AdamW kernel; elsewhere its default


class Trainer:
    """Owns the policy's optimizer (and the reference model when kl_coef > 0)."""

    def __init__(
        self,
        model: PreTrainedModel,
        lr: float,
        weight_decay: float = 0.0,
        grad_clip: float = 1.0,
        micro_batch_size: int = 64,
        epochs_per_step: int = 1,
        mini_batches_per_step: int = 1,
        clip_eps: float = 0.2,
        kl_coef: float = 0.0,
        loss_agg: LossAggregation = "token_mean",
        reference_model: PreTrainedModel | None = None,
        pad_token_id: int = 0,
        temperature: float = 1.0,
        device: str | torch.device | None = None,
        dtype: str | torch.dtype | None = None,
        gradient_checkpointing: bool = False,
        lora_rank: int = 0,
        lora_alpha: float = 16.0,
        lora_target_modules: Sequence[str] = DEFAULT_LORA_TARGETS,
        tis_cap: float | None = None,
        share: RankShare = RankShare(),
        logprob_chunk_positions: int = 0,
        own_first_proximal: bool = True,
        clip_eps_high: float | None = None,
    ) -> None:
        if temperature <= 0:
            raise ValueError(f"temperature must be > 0 (the rollouts' sampling temperature), got {temperature}")
        if tis_cap is not None and tis_cap <= 0:
            raise ValueError(f"tis_cap must be > 0 (or None: no truncated importance sampling), got {tis_cap}")
        placement = {}
        if device is not None:
            placement["device"] = _as_device(device)
        if dtype is not None:
            placement["dtype"] = resolve_dtype(dtype)
        if placement:
            model.to(**placement)
            if reference_model is not None:
                reference_model.to(**placement)
        if gradient_checkpointing:
            model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
            model.config.use_cache = False
        if lora_rank > 0:
            model = apply_lora(model, lora_rank, lora_alpha, lora_target_modules)
        self.model = model
        self.temperature = temperature
        self.grad_clip = grad_clip
        self.micro_batch_size = micro_batch_size
        self.epochs_per_step = epochs_per_step
        self.mini_batches_per_step = mini_batches_per_step
        self.clip_eps, self.clip_eps_high = clip_eps, clip_eps_high  # rl/losses.py: None = symmetric
        self.kl_coef = kl_coef
        self.loss_agg = loss_agg
        self.pad_token_id = pad_token_id
        self.tis_cap = tis_cap
        self.own_first_proximal = own_first_proximal
        self.share = share
        self.chunk = logprob_chunk_positions
        self.reference_model = None
        if kl_coef > 0:
            self.reference_model = reference_model if reference_model is not None else copy.deepcopy(model)
            self.reference_model.eval().requires_grad_(False)
        self._device = next(model.parameters()).device
        self.before_state_change: Callable[[], None] = _no_wait  # see the module docstring
        self._weights = MasterWeights([p for p in model.parameters() if p.requires_grad])
        self.optimizer = torch.optim.AdamW(self._weights.stepped, lr=lr, weight_decay=weight_decay,
                                           fused=self._device.type in FUSED_ADAMW_DEVICES or None)

    def update(self, samples: list[TrainSample], shuffle_seed: int | None = None) -> UpdateMetrics:
        """One RL update on the step's samples; see the module docstring. `shuffle_seed`
        None keeps the samples' order (contiguous mini-batches), for tests that need it."""
        scored = [sample for sample in samples if sample.advantage is not None]
        tokens = completion_tokens(scored)
        self._weights.sync_if_model_changed(self.before_state_change)  # e.g. a warm-start trained the bf16 weights
        losses, kls, clips, grad_norms, tis_weights, tis_capped = [], [], [], [], [], []
        order = random.Random(shuffle_seed) if shuffle_seed is not None else None
        own_first = self.tis_cap is not None and self._first_proximal_from_its_update()
        for epoch in range(self.epochs_per_step):
            if order is not None:
                scored = scored[:]
                order.shuffle(scored)
            if epoch == 0 and self.tis_cap is not None:  # the first mini-batch's own when its update can give them
                skipped = _split(scored, self.mini_batches_per_step)[0] if own_first else []
                scored = self._with_proximal_logprobs(scored, {id(sample) for sample in skipped})
            self.model.train()
            for index, mini_batch in enumerate(_split(scored, self.mini_batches_per_step)):
                trained = [s for s in mini_batch if self._trains(s)]
                if not trained:
                    continue
                mini_tokens = completion_tokens(mini_batch)
                normalizer = float(mini_tokens if self.loss_agg == "token_mean" else len(mini_batch))
                loss, kl, clip_frac, tis = self._accumulate(trained, normalizer, mini_tokens,
                                                            own_proximal=own_first and epoch == 0 and index == 0)
                grad_norms.append(self._optimizer_step())
                losses.append(loss), kls.append(kl), clips.append(clip_frac)
                if tis is not None:
                    tis_weights.append(tis[0]), tis_capped.append(tis[1])
        self.model.eval()
        if not losses:
            return UpdateMetrics(loss=0.0, kl=0.0, grad_norm=0.0, grad_norm_max=0.0, clip_frac=0.0, tokens=tokens)
        metrics = UpdateMetrics(
            loss=sum(losses) / len(losses),
            kl=sum(kls) / len(kls),
            grad_norm=sum(grad_norms) / len(grad_norms),
            grad_norm_max=max(grad_norms),
            clip_frac=sum(clips) / len(clips),
            tokens=tokens,
        )
        if not tis_weights:
            return metrics
        return TisUpdateMetrics(**dataclasses.asdict(metrics), tis_weight=sum(tis_weights) / len(tis_weights),
                                tis_capped_frac=sum(tis_capped) / len(tis_capped))

    def policy_gradient(self, samples: list[TrainSample]) -> torch.Tensor:
        """The gradient of the clipped policy-gradient loss of `samples` alone (normalised over
        them; no KL term, no TIS weight; the ratio against the stored logprobs) at the current
        weights: one float32 vector over the trainable parameters, on the model's device.
        By torch.autograd.grad in eval mode: no `.grad`, optimizer state or weight changes and
        no RNG is drawn, so an update after it is the update without it (rl/grad_conflict.py).
        Zeros when no sample has a nonzero advantage."""
        parameters = [parameter for parameter in self.model.parameters() if parameter.requires_grad]
        total = [torch.zeros(parameter.shape, dtype=torch.float32, device=parameter.device) for parameter in parameters]
        scored = [sample for sample in samples if sample.advantage is not None]
        normalizer = float(completion_tokens(scored) if self.loss_agg == "token_mean" else len(scored))
        was_training = self.model.training
        self.model.eval()
        try:
            for chunk in micro_batches([sample for sample in scored if sample.advantage != 0.0], self.micro_batch_size):
                batch = pad_samples(chunk, self.pad_token_id, self._device)
                loss, _ = policy_loss(token_logprobs(self.model, batch, self.temperature, self.chunk), batch.old_logprobs, batch.advantages,
                                      batch.completion_mask, self.clip_eps, loss_agg=self.loss_agg, normalizer=normalizer,
                                      clip_eps_high=self.clip_eps_high)
                for accumulated, grad in zip(total, torch.autograd.grad(loss, parameters, allow_unused=True)):
                    if grad is not None:
                        accumulated += grad.float()
        finally:
            self.model.train(was_training)
        return torch.cat([grad.reshape(-1) for grad in total])

    def _trains(self, sample: TrainSample) -> bool:
        """Advantage 0 adds nothing to the policy-gradient term: skipped unless a KL term trains it."""
        return self.kl_coef > 0 or sample.advantage != 0.0

    def _first_proximal_from_its_update(self) -> bool:
        """Whether the first mini-batch's proximal logprobs can be its own update's forward
        pass, detached: one epoch (later epochs would need them again after the weights have
        moved), and no dropout (train mode then computes what the no-grad pass computes)."""
        if not self.own_first_proximal or self.epochs_per_step != 1:
            return False
        config = getattr(self.model, "config", None)
        rates = [getattr(config, key, 0.0) or 0.0 for key in ("attention_dropout", "hidden_dropout", "dropout",
                                                              "resid_pdrop", "embd_pdrop", "attn_pdrop")]
        modules = (m for m in self.model.modules() if isinstance(m, torch.nn.Dropout) and m.p > 0)
        return not any(rates) and next(modules, None) is None

    def _with_proximal_logprobs(self, samples: list[TrainSample], skipped: set[int]) -> list[TrainSample]:
        """`samples` with the trainer's own logprobs (no grad, the current weights) on those
        that will train, except the samples whose id() is in `skipped` (their update's own
        forward pass gives them); see the module docstring (truncated importance sampling)."""
        training = [index for index, sample in enumerate(samples) if self._trains(sample) and id(sample) not in skipped]
        result = list(samples)
        self.model.eval()
        with torch.no_grad():
            for chunk in micro_batches(training, self.micro_batch_size):
                batch = pad_samples([samples[index] for index in chunk], self.pad_token_id, self._device)
                logprobs = token_logprobs(self.model, batch, self.temperature, self.chunk).cpu()
                for row, index in enumerate(chunk):
                    sample = samples[index]
                    first = len(sample.prompt_token_ids) - 1
                    values = tuple(logprobs[row, first : first + len(sample.token_ids)].tolist())
                    result[index] = dataclasses.replace(sample, proximal_logprobs=values)
        return result

    def _accumulate(self, trained: list[TrainSample], normalizer: float, tokens: int, own_proximal: bool = False
                    ) -> tuple[float, float, float, tuple[float, float] | None]:
        """Backward over all micro-batches; returns (loss, token-mean kl, clip_frac over
        `tokens`, (mean TIS weight, capped fraction) or None without TIS). `own_proximal`:
        the TIS ratio's denominator is this forward pass's logprobs, detached (the weights
        the update starts from: the first optimizer step)."""
        self.optimizer.zero_grad(set_to_none=True)
        total_loss, kl_sum, clip_sum, tis_sum, capped_sum = 0.0, 0.0, 0.0, 0.0, 0.0
        for chunk in self.share.mine(micro_batches(trained, self.micro_batch_size)):  # all of them in one process
            batch = pad_samples(chunk, self.pad_token_id, self._device)
            new_logprobs = token_logprobs(self.model, batch, self.temperature, self.chunk)
            ref_logprobs = None
            if self.reference_model is not None:
                with torch.no_grad():
                    ref_logprobs = token_logprobs(self.reference_model, batch, self.temperature, self.chunk)
            proximal = new_logprobs.detach() if own_proximal else batch.proximal_logprobs
            with_tis = proximal is not None
            loss, metrics = policy_loss(
                new_logprobs, proximal if with_tis else batch.old_logprobs, batch.advantages,
                batch.completion_mask, self.clip_eps, ref_logprobs=ref_logprobs, kl_coef=self.kl_coef,
                loss_agg=self.loss_agg, normalizer=normalizer, behaviour_logprobs=batch.old_logprobs if with_tis else None,
                tis_cap=self.tis_cap if with_tis else None, clip_eps_high=self.clip_eps_high)
            loss.backward()
            self._weights.move_grads()
            total_loss += loss.item()
            kl_sum += metrics.kl * metrics.tokens
            clip_sum += metrics.clip_frac * metrics.tokens
            if metrics.tis_weight is not None and metrics.tis_capped_frac is not None:
                tis_sum += metrics.tis_weight * metrics.tokens
                capped_sum += metrics.tis_capped_frac * metrics.tokens
        all_reduce_gradients(self._weights.stepped, self.share)  # the ranks' partial sums: the mini-batch's gradient
        total_loss, kl_sum, clip_sum, tis_sum, capped_sum = all_reduce_floats(
            [total_loss, kl_sum, clip_sum, tis_sum, capped_sum], self.share, self._device)
        trained_tokens = max(completion_tokens(trained), 1)  # TIS weights exist on trained tokens only
        tis = (tis_sum / trained_tokens, capped_sum / trained_tokens) if self.tis_cap is not None else None
        return total_loss, kl_sum / max(tokens, 1), clip_sum / max(tokens, 1), tis

    def _optimizer_step(self) -> float:
        """Clip, step, and (with master weights) round the master into the model; returns the
        pre-clip gradient norm."""
        grad_norm = float(torch.nn.utils.clip_grad_norm_(self._weights.stepped, self.grad_clip))
        self.before_state_change()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)  # 1x the weights freed before anything else (a sync) allocates
        self._weights.copy_to_model()
        return grad_norm

    def broadcast_state(self) -> None:
        """Rank 0's weights (and reference), optimizer state and fp32 masters on every rank
        of the process group (data parallel; see the module docstring)."""
        self.before_state_change()
        broadcast_module(self.model)
        if self.reference_model is not None:
            broadcast_module(self.reference_model)
        state = broadcast_object(self.state_dict(), self._device)
        if self.share.rank != 0:
            self.load_state_dict(state)

    def reset_reference(self) -> None:
        """Make the KL reference a copy of the current policy (e.g. after the warm-start)."""
        if self.reference_model is not None:
            self.reference_model.load_state_dict(self.model.state_dict())

    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """(name, tensor) for `RolloutEngine.load_weights`, detached: every parameter by the
        model's `named_parameters` names, or with LoRA only the adapter's (by the peft model's
        names, which a copy of the model wrapped by rl/lora.apply_lora has too)."""
        if is_lora_model(self.model):
            for name, parameter in adapter_named_parameters(self.model):
                yield name, parameter.detach()
            return
        for name, parameter in self.model.named_parameters():
            yield name, parameter.detach()

    def warm_start_optimizer(self) -> tuple[torch.optim.Optimizer, MasterWeights]:
        """The optimizer and the tensors it steps, for a warm start that the RL updates should
        continue (rl/warmstart.py, warmstart.keep_optimizer); then call drop_momentum()."""
        self.before_state_change()
        return self.optimizer, self._weights

    def drop_momentum(self) -> None:
        """Zero AdamW's first moments, keep its second moments and step count: the RL updates
        keep the per-weight step scale the warm start measured (small along the directions its
        gradients were large in) without being pushed along the warm start's last direction."""
        self.before_state_change()
        for state in self.optimizer.state.values():
            if "exp_avg" in state:
                state["exp_avg"].zero_()

    def state_dict(self) -> dict[str, Any]:
        """The optimizer state (torch's own format; save with torch.save or safetensors+json),
        plus the fp32 master weights under MASTER_WEIGHTS_KEY when the model is bf16: the
        live tensors, not copies."""
        state = self.optimizer.state_dict()
        masters = self._weights.state()
        return state if masters is None else {**state, MASTER_WEIGHTS_KEY: masters}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.before_state_change()
        state = dict(state)
        masters = state.pop(MASTER_WEIGHTS_KEY, None)
        implementation = [(group["fused"], group["foreach"]) for group in self.optimizer.param_groups]
        self.optimizer.load_state_dict(state)
        for group, (fused, foreach) in zip(self.optimizer.param_groups, implementation):
            group["fused"], group["foreach"] = fused, foreach  # a state saved by another implementation steps as this one
        self._weights.load(masters)


def _no_wait() -> None:  # the default `before_state_change`: nothing reads the state in the background
    return None


def _as_device(device: str | torch.device) -> torch.device:
    return device if isinstance(device, torch.device) else resolve_device(device)


def _split(samples: list[TrainSample], parts: int) -> list[list[TrainSample]]:
    """`parts` consecutive slices of near-equal size (of the shuffled samples, in `update`)."""
    parts = max(1, min(parts, len(samples)))
    size, extra = divmod(len(samples), parts)
    chunks, start = [], 0
    for index in range(parts):
        end = start + size + (1 if index < extra else 0)
        chunks.append(samples[start:end])
        start = end
    return chunks
