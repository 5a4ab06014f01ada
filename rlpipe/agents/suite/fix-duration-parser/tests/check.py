"""Hidden tests for parse_duration; the agent's code runs in another process (probe.py) and
this one compares the plain data it printed."""
import json
import subprocess
import sys

cases = {"1h30m": 5400, "45s": 45, "2h5s": 7205, "10m15s": 615, "3h": 10800, "0s": 0}
bad = ["", "5x", "h", "1h30"]
ran = subprocess.run([sys.executable, "-I", "/tests/probe.py"], input=json.dumps([*cases, *bad]),
                     capture_output=True, text=True, timeout=20, cwd="/tmp")
try:
    got = json.loads(ran.stdout.strip().splitlines()[-1])
    outcomes = {text: got[text] for text in [*cases, *bad]}
except (ValueError, IndexError, KeyError, TypeError):
    sys.exit(f"the probe printed no result (exit {ran.returncode}): {ran.stderr[-300:]}")
for text, expected in cases.items():
    value = outcomes[text].get("value") if isinstance(outcomes[text], dict) else None
    if type(value) is not int or value != expected:
        sys.exit(f"parse_duration({text!r}) gave {outcomes[text]!r}, expected {expected}")
for text in bad:
    if outcomes[text] != {"raised": "ValueError"}:
        sys.exit(f"parse_duration({text!r}) did not raise ValueError: {outcomes[text]!r}")
