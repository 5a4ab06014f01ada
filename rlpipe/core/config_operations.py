"""The tables of the run configuration that say where and how a run runs, not what it
computes (`[storage]`, `[tracking]`, `[checkpoint]`, `[sandbox]`, `[cluster]`, `[qa]`): one
frozen pydantic model per table, each field with its default, range and docstring. Most of
them are outside the config hash (core/config.py), so a resumed run may change them.

Not here: the tables of what a run computes (core/config_sections.py), the run config and its
checks (core/config.py).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field
from pydantic.json_schema import SkipJsonSchema

from rlpipe.core.config_sections import Section


class StorageConfig(Section):
    lake_uri: str = "./rlpipe-lake"
    """Where trajectories, manifests and checkpoints go: a folder or s3://bucket/prefix."""
    s3_endpoint_url: str | None = None
    """S3 endpoint (MinIO, moto...). None = AWS_ENDPOINT_URL or the AWS default."""
    s3_access_key: SkipJsonSchema[str | None] = Field(None, exclude=True)
    """None = AWS_ACCESS_KEY_ID. Never written anywhere (run.json, MLflow, Prefect), and left out
    of the JSON schema: the Prefect UI's form has no field for it, and a deployment run that
    sends one is refused by the server (set the variable in the worker's environment)."""
    s3_secret_key: SkipJsonSchema[str | None] = Field(None, exclude=True)
    """None = AWS_SECRET_ACCESS_KEY. Never written anywhere, not in the JSON schema (as s3_access_key)."""
    s3_region: str | None = None
    """None = AWS_REGION / AWS_DEFAULT_REGION, else us-east-1."""


class TrackingConfig(Section):
    mlflow_uri: str | None = None
    """MLflow tracking URI. None = `rlpipe up`'s server if running, else sqlite in ./mlruns.db."""
    experiment: str = "rlpipe"
    """MLflow experiment name."""
    log_model: bool = True
    """At the end of a run, log the final policy to its MLflow run as the artifact folder
    `model/`: a Hugging Face folder (config, safetensors weights, tokenizer; a LoRA run's
    merged weights) that `AutoModelForCausalLM.from_pretrained` loads once downloaded; and
    as an MLflow logged model (a pyfunc of the same folder: greedy completions of prompts)
    registered as a version of the registered model named by the run id. It stores the
    weights twice more beside the lake's; off, `rlpipe export RUN DIR` writes the same
    folder from the lake."""
    log_model_timeout_s: float = Field(600.0, gt=0)
    """How long the end of a run waits for that upload; a slower or failed upload is a
    warning (the run is finished all the same) and goes on in the background until the
    process ends."""


class CheckpointConfig(Section):
    every_steps: int = Field(10, gt=0)
    """Save a checkpoint every N RL steps (and always after the last)."""
    keep_last: int = Field(3, ge=0)
    """Keep the N newest checkpoints (0: keep every one). Kept besides them: the best by
    held-out accuracy when evaluations run, the one a resume restores from, and step 0 when
    algo.kl_coef > 0 (the KL reference); older ones are deleted once a newer one is
    committed (storage/checkpoint_retention.py)."""


class SandboxConfig(Section):
    backend: Literal["bwrap", "docker"] = "bwrap"
    """Isolation backend for verifiers that run code."""
    timeout_s: float = Field(10.0, gt=0)
    """Wall-clock limit of one sandboxed run."""
    memory_mb: int = Field(512, gt=0)
    """Memory limit of one sandbox."""
    pool_size: int | None = None
    """Concurrent sandboxes. None = derived from host cores and memory."""


class ClusterConfig(Section):
    """[cluster]: where work runs beyond one process. Sandboxed verification: unset
    ray_address = the local sandbox pool of [sandbox]; set = actors on a Ray cluster, each with
    its own pool (sandbox/ray_pool.py). The trainer's update: trainer_nproc ranks of a torchrun
    group on this machine (workers/trainer_group.py). The rollout engine: a local worker
    process, or with engine_on_ray a Ray actor (workers/ray_engine.py). The whole table is left out of the
    config hash: it says where the run computes, not what (a resume may change it)."""

    ray_address: str | None = None
    """A running Ray cluster's address (its head's GCS, e.g. "10.0.0.5:6379", or
    "ray://host:10001" through Ray Client) that verifies the domains that run code (code);
    None or "" = the local pool. Needs ray in this Python (`make venv-ray`) and rlpipe on the
    cluster's nodes."""
    ray_workers: int = Field(2, gt=0)
    """Verifier actors started on the cluster (spread over its nodes), each owning a pool of
    sandbox.pool_size pre-warmed sandboxes (None: sized by its node's cores and memory)."""
    ray_cpus_per_worker: float = Field(1.0, ge=0)
    """CPUs Ray reserves for each verifier actor when placing it."""
    ray_timeout_s: float = Field(600.0, gt=0)
    """Longest wait for the next share of verdicts (or for the actors to start); past it the
    stage fails with ClusterUnavailable and Prefect retries it."""
    engine_on_ray: bool = False
    """Run the rollout engine in a Ray actor on the cluster at ray_address (workers/ray_engine.py)
    instead of a local worker process: the same engine service, its weights shipped through Ray's
    object store. The actor runs in the nodes' Python (rollout.engine_python does not apply)."""
    ray_engine_cpus: float = Field(1.0, gt=0)
    """CPUs Ray reserves for the engine actor (also its torch threads)."""
    ray_engine_gpus: float = Field(0.0, ge=0)
    """GPUs Ray reserves for the engine actor; with model.device="auto" it uses the one Ray gives it."""
    trainer_nproc: int = Field(1, ge=1)
    """Processes of the trainer's update: 1 = the trainer worker updates alone; N > 1 = a
    long-lived group of N ranks started by the trainer worker with `torchrun --standalone
    --nproc-per-node N` (gloo on CPU, NCCL with one GPU per rank on CUDA), each holding the
    whole model and optimizer, computing every N-th micro-batch and all-reducing the
    gradient sums (rl/data_parallel.py). The update is the one-process update up to float
    rounding (another order of the same sums), which is why a resume may change it."""
    trainer_timeout_s: float = Field(600.0, gt=0)
    """trainer_nproc > 1: the process group's timeout (a rank waiting longer in a collective
    for a peer fails) and the longest wait for the ranks to start; past it the stage fails
    with TrainerGroupFailed and Prefect retries it on a fresh group."""


class QaConfig(Section):
    before_train: bool = False
    """Run the environment quality gate (`rlpipe qa`) on every domain of the run before its
    warm start; a failing gate stops the run (tasks/quality_gate.py)."""
    samples: int = Field(3, gt=0)
    """Tasks of each split of each domain the gate checks (`rlpipe qa --samples`): kept small."""
    repeats: int = Field(2, ge=2)
    """Times each reference and known-wrong answer is verified (`rlpipe qa --repeats`)."""
