import sys
sys.path.insert(0, "/work")
from durations import parse_duration

cases = {"1h30m": 5400, "45s": 45, "2h5s": 7205, "10m15s": 615, "3h": 10800, "0s": 0}
for text, expected in cases.items():
    got = parse_duration(text)
    if got != expected:
        sys.exit(f"parse_duration({text!r}) = {got!r}, expected {expected}")
for bad in ["", "5x", "h", "1h30"]:
    try:
        parse_duration(bad)
    except ValueError:
        continue
    sys.exit(f"parse_duration({bad!r}) did not raise ValueError")
