"""The programs rlpipe runs inside a sandbox, as real modules whose text is sent in.

What it does: `program_source(*files)` returns the text of some files of the
`rlpipe.sandbox` package (read with importlib.resources, so it works from a wheel too),
joined in order, to be run in a sandbox as `python3 -S -c TEXT` (stdlib only: rlpipe is
not installed in a sandbox). A program that needs another module's functions is sent with
that module's text above its own: `program_source("programs/cleanup.py", "programs/extents.py",
"programs/docker_work.py")`.
Each module imports those functions itself only when it is imported (by rlpipe, a test or
a linter: `if __name__ != "__main__"`), and starts its `main()` only when run as the text
of `python3 -c` (`if __name__ == "__main__"`); so one copy of each function serves both.

The modules: `cleanup.py` (the iterative tree removal, the emptying of a dir, the removal
of System V IPC objects: used by warm_server.py and docker_work.py), `warm_cleanup.py` (what
the warm server does and checks after each request: kill, empty, compare), `docker_init.py`
(the docker container's pid 1, a reaper), `extents.py` (a file's data extents, so copies
keep holes: used by docker_work.py and, on the host, tree_copy.py), `docker_work.py` (the
docker backend's wipe, file upload, snapshot tar/untar, file read and OOM count). `../warm_server.py` is one too.

What it does not: run anything (the backends do), or hold programs of the sandboxed code
(the self-test's attacks are in sandbox/attacks.py).
"""

from __future__ import annotations

from functools import cache
from importlib import resources


@cache
def program_source(*files: str) -> str:
    """The text of these files ("programs/cleanup.py", "warm_server.py": paths under
    rlpipe/sandbox/), joined in order; the last one's `main()` runs when the text is run."""
    root = resources.files("rlpipe.sandbox")
    return "\n".join(root.joinpath(*name.split("/")).read_text(encoding="utf-8") for name in files)
