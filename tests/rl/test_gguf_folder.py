"""The controller's side of a GGUF model (rl/gguf_folder.py): the conversion runs in a child
process, its errors come back as the same ModelNotFoundError, and the controller's pre-flight
of a model.gguf run never imports torch or transformers (the workers load the model)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from gguf import GGUFWriter

from rlpipe.core.errors import ModelNotFoundError
from rlpipe.rl.gguf_folder import converted_folder, converted_folder_in_child
from tests.rl.test_pretrained import write_tiny_llama_gguf

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_the_childs_refusal_comes_back_with_its_hint(tmp_path):
    writer = GGUFWriter(str(tmp_path / "odd.gguf"), "no-such-architecture")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    with pytest.raises(ModelNotFoundError, match="'no-such-architecture' model") as info:
        converted_folder_in_child(tmp_path / "odd.gguf")
    assert "llama" in info.value.hint
    assert list(tmp_path.iterdir()) == [tmp_path / "odd.gguf"]  # nothing converted


def test_a_file_that_is_not_gguf_is_refused_before_any_child(tmp_path):
    (tmp_path / "model.gguf").write_bytes(b"PK\x03\x04 a zip file")
    with pytest.raises(ModelNotFoundError, match="is not a GGUF file"):
        converted_folder_in_child(tmp_path / "model.gguf")


def test_the_preflight_of_a_gguf_run_imports_no_torch_and_its_child_converts_once(tmp_path):
    """The pre-flight converts in a child (it imports neither torch nor transformers itself)
    into the folder beside the file; a later call finds that folder and converts nothing.
    (One test: each conversion is a child that imports transformers, CI's time.)"""
    gguf_file = write_tiny_llama_gguf(tmp_path / "model.gguf")
    code = (
        "import json, sys\n"
        "from rlpipe.core.config import load_config\n"
        "from rlpipe.controller.preflight import preflight\n"
        "preflight(load_config(None, sys.argv[1:]))\n"
        "print(json.dumps({name: name in sys.modules for name in ('torch', 'transformers')}))\n"
    )
    overrides = [f'model.gguf="{gguf_file}"', "envs.domains={arithmetic=1.0}", "warmstart.steps=0",
                 "rollout.max_new_tokens=8", f'storage.lake_uri="{tmp_path / "lake"}"']
    child = subprocess.run([sys.executable, "-c", code, *overrides], capture_output=True, text=True, cwd=tmp_path,
                           env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO_ROOT), "HOME": str(tmp_path)})
    assert child.returncode == 0, child.stderr[-3000:]
    assert json.loads(child.stdout.splitlines()[-1]) == {"torch": False, "transformers": False}
    folder = converted_folder(gguf_file)
    assert (folder / "config.json").is_file()  # converted, by the child
    written = (folder / "config.json").stat().st_mtime_ns
    assert converted_folder_in_child(gguf_file) == folder and (folder / "config.json").stat().st_mtime_ns == written
