"""Task folders for the agent tests: copies of a built-in task with changed task.toml or files."""

from __future__ import annotations

import shutil
from pathlib import Path

from rlpipe.agents.task_format import builtin_suite_dir

SIMPLE_TASK = "fix-median-bug"  # sh + python3 only: runs on both backends


def copy_task(tmp_path: Path, name: str = SIMPLE_TASK, toml: str | None = None, **files: str) -> Path:
    """A copy of a built-in task under tmp_path; `toml` replaces task.toml, `files` (path with
    `__` for `/`) are written into it, and an empty value deletes that file."""
    target = tmp_path / name
    shutil.copytree(builtin_suite_dir() / name, target)
    if toml is not None:
        (target / "task.toml").write_text(toml)
    for key, text in files.items():
        path = target / key.replace("__", "/")
        if text == "":
            path.unlink()
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    return target
