#!/bin/sh
python3 - <<'PY'
import pathlib
work = pathlib.Path("/work")
for name in ["VERSION", "setup.cfg", "pkg/__init__.py", "README.md"]:
    path = work / name
    path.write_text(path.read_text().replace("1.4.2", "1.5.0"))
changelog = work / "CHANGELOG.md"
changelog.write_text(changelog.read_text().replace("## 1.4.2", "## 1.5.0\n\n- Release 1.5.0.\n\n## 1.4.2", 1))
PY
