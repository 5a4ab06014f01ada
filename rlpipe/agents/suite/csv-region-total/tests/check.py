import sys

try:
    answer = open("/work/total.txt").read().strip()
except OSError:
    sys.exit("no total.txt")
if answer != "7103.78":
    sys.exit(f"total.txt says {answer!r}")
