"""Where a GGUF file's converted HF folder lives, and its conversion in a child process:
the torch-free half of rl/pretrained.py, for the controller.

- `converted_folder(path)`: `<file stem>.hf-<first 16 hex digits of the file's sha256>/`
  beside the file (rl/pretrained.py converts into it).
- `check_gguf_header(path)`: the file exists, is readable and starts with the GGUF magic.
- `converted_folder_in_child(path)`: the folder, converted first when it is not there yet
  by a child process (`python -m rlpipe.rl.pretrained PATH`, which also checks that
  transformers loads the file's architecture); a bad file is the child's ModelNotFoundError,
  raised here with its message and hint. The controller calls this: the conversion imports
  torch and transformers and holds the dequantized model, and a child returns all of that
  memory when it exits, where the controller would keep ~0.4 GB of libraries for the whole run.

What it does not: import torch or transformers, load weights, or download anything.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

from rlpipe.core.errors import ModelNotFoundError

GGUF_MAGIC = b"GGUF"
HASH_HEX_DIGITS = 16
FETCH_HINT = "set model.gguf to an existing .gguf file; `make smollm2` downloads SmolLM2-135M-Instruct to models/smollm2/"


def converted_folder(gguf_file: str | Path) -> Path:
    """Where the HF folder converted from this file lives: beside it, keyed by its hash."""
    gguf_file = Path(gguf_file).expanduser()
    return gguf_file.parent / f"{gguf_file.stem}.hf-{file_sha256(gguf_file)[:HASH_HEX_DIGITS]}"


def file_sha256(path: Path) -> str:
    hasher = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            hasher.update(block)
    return hasher.hexdigest()


def check_gguf_header(path: str | Path) -> Path:
    """The file as a Path; ModelNotFoundError unless it exists and starts with the GGUF magic."""
    gguf_file = Path(path).expanduser()
    if not gguf_file.is_file():
        raise ModelNotFoundError(f"GGUF file not found: {gguf_file}", FETCH_HINT)
    try:
        with gguf_file.open("rb") as handle:
            magic = handle.read(len(GGUF_MAGIC))
    except OSError as exc:
        raise ModelNotFoundError(f"cannot read {gguf_file}: {exc}", FETCH_HINT) from exc
    if magic != GGUF_MAGIC:
        raise ModelNotFoundError(
            f"{gguf_file} is not a GGUF file (it starts with {magic!r}, not {GGUF_MAGIC!r})",
            "model.gguf takes a .gguf file; for a folder written by save_pretrained use model.path",
        )
    return gguf_file


def converted_folder_in_child(path: str | Path) -> Path:
    """The converted folder of a GGUF file; converted by a child process if missing."""
    gguf_file = check_gguf_header(path)
    folder = converted_folder(gguf_file)
    if (folder / "config.json").is_file():
        return folder  # converted already: transformers loaded this very file then
    child = subprocess.run([sys.executable, "-m", "rlpipe.rl.pretrained", str(gguf_file)],
                           capture_output=True, text=True, check=False)
    lines = child.stdout.strip().splitlines()
    try:
        answer = json.loads(lines[-1]) if lines else {}
    except json.JSONDecodeError:
        answer = {}
    if child.returncode == 0 and "folder" in answer:
        return Path(answer["folder"])
    if "error" in answer:
        raise ModelNotFoundError(answer["error"], answer.get("hint", ""))
    last = (child.stderr.strip().splitlines() or ["no output"])[-1]
    raise ModelNotFoundError(f"converting {gguf_file} failed in its child process (exit {child.returncode}): {last}",
                             "run `python -m rlpipe.rl.pretrained FILE` to see the whole error")
