"""Files, snapshots and reset of the docker sandbox backend (the non-adversarial contract)."""

from __future__ import annotations

import pytest

from rlpipe.core.errors import SandboxUnavailable
from rlpipe.sandbox.base import Limits
from tests.helpers.docker_engine import no_docker

pytestmark = pytest.mark.docker


@pytest.fixture
def sandbox():
    from rlpipe.sandbox.docker_backend import DockerSandbox

    try:
        sandbox = DockerSandbox(Limits(timeout_s=10))
    except SandboxUnavailable as exc:
        no_docker(exc.message)
    yield sandbox
    sandbox.close()


def test_stdin_reaches_the_command_and_both_streams_come_back(sandbox):
    result = sandbox.exec(["python3", "-c", "import sys; d = sys.stdin.read(); print(d[::-1]); print('e', file=sys.stderr)"],
                          stdin=b"abc")
    assert (result.exit_code, result.stdout, result.stderr) == (0, "cba\n", "e\n")


def test_written_files_can_be_run_and_read_back(sandbox):
    sandbox.write_files({"pkg/mod.py": b"VALUE = 7\n", "main.py": b"from pkg.mod import VALUE\nopen('out', 'w').write(str(VALUE * 6))\n"})
    assert sandbox.exec(["python3", "main.py"]).exit_code == 0
    assert sandbox.read_file("out") == b"42"


def test_read_file_of_a_missing_path_raises_file_not_found(sandbox):
    with pytest.raises(FileNotFoundError):
        sandbox.read_file("missing.txt")


def test_paths_outside_the_work_dir_are_rejected(sandbox):
    with pytest.raises(ValueError):
        sandbox.write_files({"../etc/x": b""})


def test_restore_rolls_back_and_forks_from_one_state(sandbox):
    sandbox.write_files({"state.txt": b"initial"})
    initial = sandbox.snapshot()
    for attempt in range(2):
        sandbox.exec(["sh", "-c", f"echo changed{attempt} > state.txt; echo new > extra.txt"])
        sandbox.restore(initial)
        assert sandbox.read_file("state.txt") == b"initial"
        with pytest.raises(FileNotFoundError):
            sandbox.read_file("extra.txt")


def test_reset_empties_work_and_tmp_even_when_the_code_locked_a_dir(sandbox):
    sandbox.exec(["sh", "-c", "mkdir -p d/e 2>/dev/null; python3 -c \"import os; os.makedirs('d/e', exist_ok=True); "
                  "open('d/e/f','w'); open('/tmp/t','w'); os.chmod('d/e', 0); os.chmod('d', 0o500)\""])
    sandbox.reset()
    listing = sandbox.exec(["python3", "-c", "import os; print(os.listdir('/work'), os.listdir('/tmp'))"])
    assert listing.stdout == "[] []\n"


def test_a_stopped_container_is_replaced_on_the_next_exec(sandbox):
    sandbox._client.api.kill(sandbox._container_id)  # as if the OOM killer had picked its init
    sandbox._client.api.wait(sandbox._container_id, timeout=30)
    assert sandbox.exec(["sh", "-c", "echo back"]).stdout == "back\n"


def test_write_files_replaces_a_planted_symlink_instead_of_following_it(sandbox):
    sandbox.exec(["python3", "-c", "import os; os.symlink('/tmp/elsewhere', 'solution.py')"])
    sandbox.write_files({"solution.py": b"x = 1\n"})
    check = sandbox.exec(["python3", "-c", "import os; print(os.path.islink('solution.py'), os.path.exists('/tmp/elsewhere'))"])
    assert check.stdout == "False False\n"
