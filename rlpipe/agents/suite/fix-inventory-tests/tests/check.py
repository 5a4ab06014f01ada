"""Hidden tests for Inventory; the agent's code runs in another process (probe.py) and this
one compares the plain data it printed."""
import json
import subprocess
import sys

ran = subprocess.run([sys.executable, "-I", "/tests/probe.py"], capture_output=True, text=True, timeout=20, cwd="/tmp")
try:
    seen = json.loads(ran.stdout.strip().splitlines()[-1])
    total, refused, kept, left = (seen[key] for key in ("total_value", "refused_removal", "b_after_refusal", "b_after_removal"))
except (ValueError, IndexError, KeyError, TypeError):
    sys.exit(f"the probe printed no result (exit {ran.returncode}): {ran.stderr[-300:]}")
if type(total) not in (int, float) or abs(total - 15.5) > 1e-9:  # 4 * 2.0 + 5 * 1.5
    sys.exit(f"total_value = {total!r}, expected 15.5")
if refused != "ValueError":
    sys.exit("removing 6 of 5 did not raise ValueError")
if type(kept) is not int or kept != 5:
    sys.exit("a refused removal changed the stock")
if type(left) is not int or left != 0:
    sys.exit("removing all of b did not leave 0")
