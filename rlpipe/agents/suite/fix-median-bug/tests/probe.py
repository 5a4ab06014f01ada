"""Runs the agent's stats.py in its own process (check.py starts it): prints plain data only."""
import json
import sys

sys.path.insert(0, "/work")
from stats import mean, median  # noqa: E402

cases = json.loads(sys.stdin.read())
print(json.dumps({"median": [median(list(values)) for values in cases], "mean": mean([2, 4])}))
