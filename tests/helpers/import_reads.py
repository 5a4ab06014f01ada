"""Which environment variables a zygote's imports read by name (the zygotes' tests).

`read_at_import("rlpipe.workers.zygote")` imports that module's PRELOAD in a fresh interpreter
whose os.environ counts each lookup, and returns the variables read by name and the modules
then loaded. Code that iterates over the environment (tqdm and fsspec look for their own
prefixes) reads every variable, a probe variable too; a variable read more often than the
probe, or read while absent, was read by its name.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
PROBE = "RLPIPE_IMPORT_READS_PROBE"
SCRIPT = textwrap.dedent("""
    import collections, importlib, json, os, sys
    present, reads = set(os.environ), collections.Counter()

    class Tracking(os._Environ):
        def __getitem__(self, key):
            reads[key] += 1
            return super().__getitem__(key)

    os.environ.__class__ = Tracking
    for name in importlib.import_module(sys.argv[1]).PRELOAD:
        importlib.import_module(name)
    iterations = reads[sys.argv[2]]
    print(json.dumps({"read": sorted(str(key) for key, count in reads.items()
                                     if count > iterations or (count and key not in present)),
                      "modules": sorted(sys.modules)}))
""")


def read_at_import(module: str) -> tuple[set[str], set[str]]:
    """(variables read by name, modules loaded) after importing `module`.PRELOAD."""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), PROBE: "1"}
    result = subprocess.run([sys.executable, "-c", SCRIPT, module, PROBE], env=env, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    seen = json.loads(result.stdout.splitlines()[-1])
    return set(seen["read"]), set(seen["modules"])
