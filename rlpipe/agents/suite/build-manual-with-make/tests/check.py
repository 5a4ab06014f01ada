import subprocess
import sys

subprocess.run(["rm", "-rf", "/work/dist"], check=True)
ran = subprocess.run(["make"], cwd="/work", capture_output=True, text=True, timeout=60)
if ran.returncode != 0:
    sys.exit(f"make failed: {ran.stderr[-400:]}")
expected = 'Introduction\nThis manual explains the tool.\nUsage\nRun the tool with a file name.\nFAQ\nQ: Is it fast? A: Yes.\n'
try:
    got = open("/work/dist/manual.txt").read()
except OSError:
    sys.exit("make wrote no dist/manual.txt")
if got != expected:
    sys.exit(f"dist/manual.txt holds {got!r}")
