import pathlib
import subprocess
import sys

mentions = [str(path) for path in pathlib.Path("/work").rglob("*.py") if "get_user" in path.read_text()]
if mentions:
    sys.exit(f"get_user is still mentioned in {mentions}")
ran = subprocess.run([sys.executable, "main.py"], cwd="/work", capture_output=True, text=True, timeout=20)
expected = "ada: 35\ngrace: 12\nlinus: 7\nfirst customer: ada\n"
if ran.returncode != 0 or ran.stdout != expected:
    sys.exit(f"main.py printed {ran.stdout!r} (exit {ran.returncode}): {ran.stderr[-300:]}")
sys.path.insert(0, "/work")
import shop.users
if not callable(getattr(shop.users, "fetch_user", None)) or hasattr(shop.users, "get_user"):
    sys.exit("shop.users must define fetch_user and no get_user")
