"""The files of a checkpoint folder (rl/checkpoint.py writes and reads them), as names only,
so that the controller (which exports the policy) never imports torch.

The layout is Hugging Face Trainer's: the step folder itself is a model folder that
`AutoModelForCausalLM.from_pretrained(step_folder)` and `AutoTokenizer.from_pretrained(
step_folder)` load (config.json, generation_config.json, model.safetensors, the tokenizer
files), and what only rlpipe needs to go on training lies beside them: optimizer.pt (the AdamW
state, and the fp32 master weights of a bf16 policy), rlpipe_checkpoint.json (step, policy
version, config hash) and, for a LoRA policy, adapter/ (peft's own layout). The model files
of a LoRA checkpoint are the merged weights.

Checkpoints written before this layout put the model in policy/ and the rest in trainer/
(LEGACY_LAYOUT); `layout_of` tells the two apart from a folder's file list, and every reader
(restore, export, the final MLflow model) reads both.

What it does not: read or write files (rl/checkpoint.py, storage/checkpoint_store.py).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

WEIGHTS_NAME = "model.safetensors"
OPTIMIZER_NAME = "optimizer.pt"
META_NAME = "rlpipe_checkpoint.json"
ADAPTER_NAME = "adapter"
ADAPTER_WEIGHTS_NAME = "adapter_model.safetensors"
LEGACY_POLICY_DIR = "policy"


@dataclass(frozen=True)
class CheckpointLayout:
    """Where the model files and the trainer files lie in a step folder ("" = at its top)."""

    policy_dir: str
    trainer_dir: str

    def _join(self, folder: str, name: str) -> str:
        return f"{folder}/{name}" if folder else name

    @property
    def weights_file(self) -> str:
        return self._join(self.policy_dir, WEIGHTS_NAME)

    @property
    def optimizer_file(self) -> str:
        return self._join(self.trainer_dir, OPTIMIZER_NAME)

    @property
    def meta_file(self) -> str:
        return self._join(self.trainer_dir, META_NAME)

    @property
    def adapter_dir(self) -> str:
        return self._join(self.trainer_dir, ADAPTER_NAME)

    @property
    def adapter_file(self) -> str:
        return f"{self.adapter_dir}/{ADAPTER_WEIGHTS_NAME}"

    def is_policy_file(self, path: str) -> bool:
        """Whether `path` (relative to the step folder) is one of the model's files (what an
        export copies): not the trainer's state, not the adapter."""
        if self.policy_dir:
            return path.startswith(f"{self.policy_dir}/")
        return path not in (self.optimizer_file, self.meta_file) and not path.startswith(f"{self.adapter_dir}/")

    def policy_name(self, path: str) -> str:
        """A model file's path relative to the model folder."""
        return path[len(self.policy_dir) + 1:] if self.policy_dir else path


LAYOUT = CheckpointLayout(policy_dir="", trainer_dir="")
LEGACY_LAYOUT = CheckpointLayout(policy_dir=LEGACY_POLICY_DIR, trainer_dir="trainer")


def layout_of(paths: Iterable[str]) -> CheckpointLayout:
    """The layout of a step folder holding `paths` (relative): LEGACY_LAYOUT when its model is
    in policy/, else LAYOUT."""
    return LEGACY_LAYOUT if any(path.startswith(f"{LEGACY_POLICY_DIR}/") for path in paths) else LAYOUT


# the names of the layout rlpipe writes
WEIGHTS_FILE = LAYOUT.weights_file
OPTIMIZER_FILE = LAYOUT.optimizer_file
META_FILE = LAYOUT.meta_file
ADAPTER_DIR = LAYOUT.adapter_dir
ADAPTER_FILE = LAYOUT.adapter_file
