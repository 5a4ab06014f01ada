#!/bin/sh
python3 -c 'import sys; open(sys.argv[1], "w").write(sys.stdin.read())' /work/durations.py <<'PY'
"""Parse durations like 1h30m into seconds."""
import re

_UNITS = {"h": 3600, "m": 60, "s": 1}


def parse_duration(text):
    if not re.fullmatch(r"(\d+[hms])+", text):
        raise ValueError(f"not a duration: {text!r}")
    return sum(int(number) * _UNITS[unit] for number, unit in re.findall(r"(\d+)([hms])", text))
PY
