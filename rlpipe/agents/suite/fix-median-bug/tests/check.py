"""Hidden tests for median: the agent's own copy of the tests may have been edited.

The agent's code runs in another process (probe.py); this one compares the plain numbers
it printed, so nothing the agent's module does at import or in a return value's methods
can pass for a right answer."""
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

cases = [([3, 1, 2], 2), ([4, 1, 3, 2], 2.5), ([5], 5), ([1, 2], 1.5), ([10, 0, 4, 6, 8, 2], 5)]
got, why = probe(json.dumps([values for values, _ in cases]))
try:
    medians, mean = got["median"], got["mean"]
except (KeyError, TypeError):
    sys.exit(f"the probe printed no result ({why})")
for (values, expected), value in zip(cases, medians):
    if type(value) not in (int, float) or value != expected:
        sys.exit(f"median({values}) = {value!r}, expected {expected!r}")
if len(medians) != len(cases) or type(mean) not in (int, float) or mean != 3:
    sys.exit("mean is broken")
print("all median cases pass")
