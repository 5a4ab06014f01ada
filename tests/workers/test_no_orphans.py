"""A controller killed with SIGKILL leaves no worker behind: each worker's watchdog sees
its owner gone and exits, and removes the run's socket and weights folders; the zygote the
workers were forked from (workers/launch.py) exits too. (A shared zygote outlives the
controller: test_shared_zygote.py.)"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.durability.cli_runs import REPO_ROOT
from tests.helpers.processes import own_zygote_env
from tests.workers.workers_at_hand import alive, wait_until_gone

CONTROLLER = textwrap.dedent("""
    import json, sys, time
    from pathlib import Path
    from rlpipe.workers.launch import zygote_pid
    from tests.workers.workers_at_hand import worker_pair
    with worker_pair(Path(sys.argv[1])) as (engine, trainer, shm):
        engine.version(), trainer.digest()  # both ready
        print(json.dumps({"pids": [engine.pid, trainer.pid], "zygote": zygote_pid(), "sockets": str(engine.spec.socket_folder),
                          "shm": str(shm)}), flush=True)
        time.sleep(600)
""")


def test_a_controller_killed_with_sigkill_leaves_no_worker_behind(tmp_path: Path) -> None:
    env = own_zygote_env({**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    controller = subprocess.Popen([sys.executable, "-c", CONTROLLER, str(tmp_path)], stdout=subprocess.PIPE,
                                  text=True, env=env, cwd=REPO_ROOT)
    try:
        started = json.loads(controller.stdout.readline())
        pids = started["pids"] + [started["zygote"]]
        assert all(alive(pid) for pid in pids)
        controller.kill()  # SIGKILL: no finally, no atexit
        controller.wait()
        assert controller.returncode == -signal.SIGKILL
        assert wait_until_gone(pids, timeout_s=60) == []
        assert not Path(started["sockets"]).exists() and not Path(started["shm"]).exists()
    finally:
        if controller.poll() is None:
            controller.kill()
