"""Hidden checks of the rename; the agent's code runs in other processes (main.py, probe.py)
and this one compares the plain data they printed."""
import json
import pathlib
import subprocess
import sys

mentions = [str(path) for path in pathlib.Path("/work").rglob("*.py") if "get_user" in path.read_text(errors="replace")]
if mentions:
    sys.exit(f"get_user is still mentioned in {mentions}")
ran = subprocess.run([sys.executable, "-s", "main.py"], cwd="/work", capture_output=True, text=True, timeout=20)
expected = "ada: 35\ngrace: 12\nlinus: 7\nfirst customer: ada\n"
if ran.returncode != 0 or ran.stdout != expected:
    sys.exit(f"main.py printed {ran.stdout!r} (exit {ran.returncode}): {ran.stderr[-300:]}")
ran = subprocess.run([sys.executable, "-I", "/tests/probe.py"], capture_output=True, text=True, timeout=20, cwd="/tmp")
try:
    names = json.loads(ran.stdout.strip().splitlines()[-1])
except (ValueError, IndexError):
    sys.exit(f"the probe printed no result (exit {ran.returncode}): {ran.stderr[-300:]}")
if names != {"fetch_user": True, "get_user": False}:
    sys.exit("shop.users must define fetch_user and no get_user")
