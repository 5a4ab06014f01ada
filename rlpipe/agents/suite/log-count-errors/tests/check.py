import sys

try:
    answer = open("/work/answer.txt").read().strip()
except OSError:
    sys.exit("no answer.txt")
if answer != "26":
    sys.exit(f"answer.txt says {answer!r}")
