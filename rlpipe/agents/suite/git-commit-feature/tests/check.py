import subprocess
import sys

def git(*args):
    return subprocess.run(["git", *args], cwd="/work", capture_output=True, text=True, timeout=20)

log = git("log", "--format=%s", "main").stdout.splitlines()
if log != ["Add feature flags", "Initial commit"]:
    sys.exit(f"history of main is {log!r}")
if git("status", "--porcelain").stdout.strip():
    sys.exit("the working tree is not clean")
files = git("show", "--name-only", "--format=", "HEAD").stdout.split()
if sorted(files) != ["feature.py", "flags.py"]:
    sys.exit(f"the new commit changes {files!r}")
