import json
import sys

try:
    totals = json.load(open("/work/totals.json"))
except (OSError, ValueError) as exc:
    sys.exit(f"totals.json does not load: {exc}")
expected = {"ana": 19.75, "bo": 10.3}  # 12.5 + 7.25; 10.1 + 0.2
if not isinstance(totals, dict) or set(totals) != set(expected) or any(abs(totals[u] - v) > 0.005 for u, v in expected.items()):
    sys.exit(f"totals.json holds {totals!r}, expected {expected!r}")
