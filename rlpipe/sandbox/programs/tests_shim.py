"""`pytest`, `py.test`, `uvx` and `uv` of the tests runtime (stdlib only; run in a sandbox).

Installed by sandbox/tests_runtime.py as RUNTIME/shim.py, with RUNTIME/bin/NAME shell
scripts that run `python3 -I RUNTIME/shim.py NAME ARGS`: isolated (no user site, no cwd
on the path, no PYTHON* variable read by Python itself), so no file of the agent's work dir
is imported in place of pytest. Then:

    pytest ARGS, py.test ARGS          pytest from RUNTIME/site (PYTHONPATH's entries after
                                       it, as a test.sh or the task's ENV sets them)
    uvx [OPTIONS] pytest[==V] ARGS     the same; uvx's options (-p/--python, -w/--with,
                                       --from, ...) are read and dropped: offline, the
                                       runtime's pytest and pytest-json-ctrf serve
    uv run [OPTIONS] pytest ARGS,
    uv run [OPTIONS] python -m pytest ARGS   the same
    uv pip install ..., uv sync, uv venv     do nothing, say so, exit 0
    anything else                      exit 127 saying the runtime is offline and what it has

What it does not: install packages, reach a network, or run a command other than pytest.
"""

import os
import sys

RUNTIME = os.path.dirname(os.path.abspath(__file__))
_VALUE_OPTIONS = {"-p", "--python", "-w", "--with", "--with-editable", "--with-requirements", "--from", "--index",
                  "--index-url", "--extra-index-url", "--find-links", "-f", "--directory", "--project", "--env-file",
                  "--cache-dir", "--config-file", "--python-preference", "--resolution", "--prerelease",
                  "--exclude-newer", "--package", "--extra", "--group", "--only-group", "-C", "--config-setting"}
_PROVIDED = "pytest, pluggy, iniconfig, packaging and pytest-json-ctrf"


def run_pytest(args):
    extra = [path for path in os.environ.get("PYTHONPATH", "").split(os.pathsep) if path]
    sys.path[:0] = [os.path.join(RUNTIME, "site"), *extra]
    sys.argv = ["pytest", *args]
    import pytest

    code = pytest.main(args)
    sys.stdout.flush()
    return int(code)


def _command(args):
    """(the command's words, after uv/uvx's own options)."""
    at = 0
    while at < len(args) and args[at].startswith("-"):
        at += 2 if args[at] in _VALUE_OPTIONS else 1
    return args[at:]


def _is_pytest(word):
    return word.split("==")[0].split("@")[0] in ("pytest", "py.test")


def main(argv):
    name, args = os.path.basename(argv[0]), argv[1:]
    if name in ("pytest", "py.test"):
        return run_pytest(args)
    if name == "uv":
        if args[:1] == ["run"]:
            args = args[1:]
        elif args[:2] == ["pip", "install"] or args[:1] in (["sync"], ["venv"], ["add"]):
            sys.stderr.write(f"rlpipe tests runtime: offline; `uv {' '.join(args[:2])}` does nothing ({_PROVIDED} are "
                             "provided)\n")
            return 0
        else:
            args = ["--unsupported", *args]
    words = _command(args)
    if words and _is_pytest(words[0]):
        return run_pytest(words[1:])
    if len(words) >= 3 and words[0].startswith("python") and words[1:3] == ["-m", "pytest"]:
        return run_pytest(words[3:])
    sys.stderr.write(f"rlpipe tests runtime: offline; {name} here runs pytest only ({_PROVIDED}), not: "
                     f"{' '.join(args)}\n")
    return 127


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
