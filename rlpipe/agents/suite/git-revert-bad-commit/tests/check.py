import subprocess
import sys

def git(*args):
    return subprocess.run(["git", *args], cwd="/work", capture_output=True, text=True, timeout=20)

log = git("log", "--format=%s", "main").stdout.splitlines()
if len(log) < 5 or log[-4:] != ["Add changelog", "Tune retries", "Add docs", "Initial config"]:
    sys.exit(f"the history of main is {log!r}: the old commits must stay, with a new one on top")
if open("/work/config.yaml").read() != "retries: 3\ntimeout: 10\n":
    sys.exit("config.yaml does not have retries: 3 back")
for name in ("README.md", "CHANGELOG.md"):
    if git("ls-files", "--error-unmatch", name).returncode != 0:
        sys.exit(f"{name} is no longer committed")
if git("status", "--porcelain").stdout.strip():
    sys.exit("the working tree is not clean")
