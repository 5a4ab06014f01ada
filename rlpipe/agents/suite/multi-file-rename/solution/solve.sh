#!/bin/sh
python3 - <<'PY'
import pathlib
for path in pathlib.Path("/work").rglob("*.py"):
    text = path.read_text()
    if "get_user" in text:
        path.write_text(text.replace("get_user", "fetch_user"))
PY
