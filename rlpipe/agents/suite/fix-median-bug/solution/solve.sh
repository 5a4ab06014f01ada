#!/bin/sh
# Average the two middle values when the length is even.
python3 - <<'PY'
import pathlib
path = pathlib.Path("/work/stats.py")
source = path.read_text()
source = source.replace(
    "    return ordered[middle]\n",
    "    if len(ordered) % 2 == 0:\n        return (ordered[middle - 1] + ordered[middle]) / 2\n    return ordered[middle]\n",
)
path.write_text(source)
PY
