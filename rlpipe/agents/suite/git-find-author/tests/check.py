import sys

try:
    answer = open("/work/answer.txt").read().strip()
except OSError:
    sys.exit("no answer.txt")
if answer != "cy@corp.example":
    sys.exit(f"answer.txt says {answer!r}")
