"""Runs the agent's durations.py in its own process (check.py starts it): prints plain data only."""
import json
import sys

sys.path.insert(0, "/work")
from durations import parse_duration  # noqa: E402

results = {}
for text in json.loads(sys.stdin.read()):
    try:
        results[text] = {"value": parse_duration(text)}
    except ValueError:
        results[text] = {"raised": "ValueError"}
print(json.dumps(results))
