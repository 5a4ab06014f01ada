"""A pretrained model from a GGUF file (e.g. SmolLM2-135M-Instruct from `make smollm2`).

What it does:
- `load_gguf_model(path)` returns (model, tokenizer) like `rl.policy.load_local_model`. The
  first call checks the file (exists, starts with the GGUF magic, names an architecture
  transformers can load), loads it through transformers (`from_pretrained(folder,
  gguf_file=...)` with `GgufConfig(dequantize=True)`: every weight unpacked to a dense float32
  tensor, no quantization state left on the model, so it trains and saves like any other),
  and saves model + tokenizer (with its chat template) as an HF folder beside the file:
  `<file stem>.hf-<first 16 hex digits of the file's sha256>/`. That conversion takes ~30-60 s
  on 2 cores; every call, the first included, then loads the folder through
  `load_local_model` (about a second), so the first run and later runs see the same model.
  A changed file has another hash, hence another folder. The folder appears atomically (written
  under a temporary name, then renamed), so a run killed mid-conversion leaves no half folder
  that a later run would trust.
- `converted_folder(path)` says where that folder is (rl/gguf_folder.py, torch-free: the
  controller's pre-flight converts through `python -m rlpipe.rl.pretrained FILE`, this
  module's command, in a child process).

What it does not: download anything, keep weights quantized (training needs dense weights),
choose a device or dtype (callers move the model), or convert GGUF files that are not
causal language models of an architecture transformers maps from GGUF.
"""

from __future__ import annotations

import json
import os
import sys
import shutil
import tempfile
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig, PreTrainedModel, PreTrainedTokenizerFast

from rlpipe.core.errors import ModelNotFoundError
from rlpipe.rl.gguf_folder import check_gguf_header, converted_folder
from rlpipe.rl.policy import load_local_model


def load_gguf_model(path: str | Path) -> tuple[PreTrainedModel, PreTrainedTokenizerFast]:
    """(model, tokenizer) of a GGUF file, through its converted HF folder (made on first use)."""
    return load_local_model(converted_gguf_folder(path))


def converted_gguf_folder(path: str | Path) -> Path:
    """The HF folder converted from a GGUF file, converting it first if it is not there yet
    (callers load it with `load_local_model`, on the device and in the dtype they choose)."""
    gguf_file = Path(path).expanduser()
    if gguf_file.is_file() and (converted_folder(gguf_file) / "config.json").is_file():
        return converted_folder(gguf_file)  # converted already (the vLLM venv has no gguf reader)
    gguf_file = check_gguf_file(path)
    folder = converted_folder(gguf_file)
    if not (folder / "config.json").is_file():
        _convert(gguf_file, folder)
    return folder


def check_gguf_file(path: str | Path) -> Path:
    """The file as a Path; ModelNotFoundError unless it is a readable GGUF file of an
    architecture transformers can load."""
    gguf_file = check_gguf_header(path)
    architecture = gguf_architecture(gguf_file)
    if architecture not in supported_architectures():
        raise ModelNotFoundError(
            f"{gguf_file} holds a {architecture!r} model, which transformers cannot load from GGUF",
            f"use a GGUF file of one of: {', '.join(sorted(supported_architectures()))}",
        )
    return gguf_file


def gguf_architecture(gguf_file: Path) -> str:
    """The `general.architecture` field of a GGUF file's metadata (no tensor is read)."""
    from gguf import GGUFReader

    try:
        reader = GGUFReader(gguf_file)
        field = reader.fields["general.architecture"]
        return bytes(field.parts[field.data[0]]).decode("utf-8")
    except (KeyError, IndexError, ValueError, OSError) as exc:
        raise ModelNotFoundError(f"cannot read the metadata of {gguf_file}: {exc}",
                                 "the file may be truncated; fetch it again (`make smollm2`)") from exc


def supported_architectures() -> frozenset[str]:
    """GGUF architectures this transformers version loads (its legacy mapping and its new path)."""
    from transformers.integrations.gguf.gguf_conversion_mapping import GGUF_ARCHS
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    return frozenset(GGUF_SUPPORTED_ARCHITECTURES) | frozenset(GGUF_ARCHS)


def _convert(gguf_file: Path, folder: Path) -> None:
    """Dequantize the GGUF file through transformers and save it as an HF folder, atomically."""
    options = dict(gguf_file=gguf_file.name, local_files_only=True)
    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf_file.parent, **options)
        model = AutoModelForCausalLM.from_pretrained(
            gguf_file.parent, quantization_config=GgufConfig(gguf_file=str(gguf_file), dequantize=True),
            dtype=torch.float32, **options,
        )
    except (OSError, ValueError, KeyError, RuntimeError) as exc:
        raise ModelNotFoundError(f"transformers cannot load {gguf_file}: {exc}",
                                 "use a GGUF file of a causal language model (e.g. `make smollm2`)") from exc
    try:
        staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
    except OSError as exc:
        raise ModelNotFoundError(f"cannot write the converted model beside {gguf_file}: {exc}",
                                 "put the .gguf file in a folder you can write to") from exc
    try:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        os.replace(staging, folder)
    except OSError as exc:
        if (folder / "config.json").is_file():  # another process converted it first
            return
        raise ModelNotFoundError(f"cannot save the converted model to {folder}: {exc}",
                                 "free disk space, or put the .gguf file in a folder you can write to") from exc
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def main(argv: list[str]) -> int:
    """`python -m rlpipe.rl.pretrained FILE`: check and convert FILE; the last line of stdout
    is {"folder": ...} or {"error": ..., "hint": ...} (rl/gguf_folder.py reads it)."""
    try:
        check_gguf_file(argv[0])
        print(json.dumps({"folder": str(converted_gguf_folder(argv[0]))}))
        return 0
    except ModelNotFoundError as exc:
        print(json.dumps({"error": exc.message, "hint": exc.hint}))
        return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
