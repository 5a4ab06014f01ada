"""Hidden checks of the rename; the agent's code runs in other processes (main.py, probe.py)
and this one compares the plain data they printed."""
import json
import pathlib
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

mentions = [str(path) for path in pathlib.Path("/work").rglob("*.py") if "get_user" in path.read_text(errors="replace")]
if mentions:
    sys.exit(f"get_user is still mentioned in {mentions}")
ran = subprocess.run([sys.executable, "-s", "main.py"], cwd="/work", capture_output=True, text=True, timeout=20)
expected = "ada: 35\ngrace: 12\nlinus: 7\nfirst customer: ada\n"
if ran.returncode != 0 or ran.stdout != expected:
    sys.exit(f"main.py printed {ran.stdout!r} (exit {ran.returncode}): {ran.stderr[-300:]}")
names, why = probe()
if names != {"fetch_user": True, "get_user": False}:
    sys.exit("shop.users must define fetch_user and no get_user")
