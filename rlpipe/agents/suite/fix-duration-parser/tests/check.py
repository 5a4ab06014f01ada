"""Hidden tests for parse_duration; the agent's code runs in another process (probe.py) and
this one compares the plain data it printed."""
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

cases = {"1h30m": 5400, "45s": 45, "2h5s": 7205, "10m15s": 615, "3h": 10800, "0s": 0}
bad = ["", "5x", "h", "1h30"]
got, why = probe(json.dumps([*cases, *bad]))
try:
    outcomes = {text: got[text] for text in [*cases, *bad]}
except (KeyError, TypeError):
    sys.exit(f"the probe printed no result ({why})")
for text, expected in cases.items():
    value = outcomes[text].get("value") if isinstance(outcomes[text], dict) else None
    if type(value) is not int or value != expected:
        sys.exit(f"parse_duration({text!r}) gave {outcomes[text]!r}, expected {expected}")
for text in bad:
    if outcomes[text] != {"raised": "ValueError"}:
        sys.exit(f"parse_duration({text!r}) did not raise ValueError: {outcomes[text]!r}")
