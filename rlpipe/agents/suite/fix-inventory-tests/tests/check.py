"""Hidden tests for Inventory; the agent's code runs in another process (probe.py) and this
one compares the plain data it printed."""
import json
import subprocess
import sys
import tempfile


def probe(stdin=""):
    """probe.py's last stdout line as JSON (None if it printed none), and its stderr's tail.
    Its output goes to files, not pipes: a process the agent's code leaves behind holding
    them cannot keep this check waiting."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        ran = subprocess.run([sys.executable, "-I", "/tests/probe.py"], input=stdin, stdout=out, stderr=err,
                             text=True, timeout=20, cwd="/tmp")
        out.seek(0)
        err.seek(0)
        lines, why = out.read().strip().splitlines(), f"exit {ran.returncode}: {err.read()[-300:]}"
    try:
        return json.loads(lines[-1]), why
    except (ValueError, IndexError):
        return None, why

seen, why = probe()
try:
    total, refused, kept, left = (seen[key] for key in ("total_value", "refused_removal", "b_after_refusal", "b_after_removal"))
except (KeyError, TypeError):
    sys.exit(f"the probe printed no result ({why})")
if type(total) not in (int, float) or abs(total - 15.5) > 1e-9:  # 4 * 2.0 + 5 * 1.5
    sys.exit(f"total_value = {total!r}, expected 15.5")
if refused != "ValueError":
    sys.exit("removing 6 of 5 did not raise ValueError")
if type(kept) is not int or kept != 5:
    sys.exit("a refused removal changed the stock")
if type(left) is not int or left != 0:
    sys.exit("removing all of b did not leave 0")
