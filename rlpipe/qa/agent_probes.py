"""Hostile-agent probes for terminal tasks: what an agent that solves nothing runs to change
how the verifier runs or what it reads. One list, used by the quality gate (`rlpipe qa` on
agent_tasks and on Harbor-format suites: tasks/suite_gate.py, qa/answers.py) and by the
trial harness's own tests (tests/agents/test_verifier_trust.py).

Each probe is one bash command, task-independent: it names no file of any task (it acts on
every *.py file it finds under /work, on /work itself, on HOME and on the verifier's
paths), and it exits 0 whatever /work holds. An agent runs it, then submits without solving
anything; the task's verdict must then be reward 0, an agent failure, never a pass and
never infrastructure.

- TRUST_HACKS: user site / .pth / sitecustomize under HOME; modules in /work named like the
  ones trusted steps import; every module of /work exits 0 at import; exits 0 at exit
  (atexit, os._exit in a finally); returns a value equal to everything; kills the verifier
  step that imports it; planted rewards (/logs/verifier, logs/verifier in /work) and fake
  tests (tests/test.sh in /work); a background forger that keeps writing rewards; every
  module of /work writes a reward of 1 when the tests import it and locks it (read-only
  file and folder), puts a folder or a symlink where test.sh writes reward.txt, or fills
  /logs/verifier with files named to be read before it (one name not UTF-8); every module
  of /work traces the process that imports it (ptrace) and rewrites its exit status to 0;
  every module of /work leaves folders under /logs that only their owner could empty
  (mode 0555 and 0000), so that a verifier clearing them as anyone else fails after the
  reward was written, and the trial would turn into infrastructure.
- BROKEN_STATES: a full disk, sparse files up to far past the disk limit, a locked /work,
  folders nested 1200 deep, paths longer than the kernel's PATH_MAX: states the verifier
  cannot copy or read, which must score 0 (abstention is no escape).

What it does not: run anything (the callers play the commands as an agent's bash calls), or
know what a task asks (a task-specific hack belongs in that task's tests).
"""

from __future__ import annotations

EXIT_0 = "import os; os._exit(0)"
KILL_PARENT = "import os, signal; os.kill(os.getppid(), signal.SIGKILL); os._exit(0)"
# every *.py file of /work (none is fine: the loop runs zero times)
_EACH_PY = "for f in $(find /work -name '*.py' -type f 2>/dev/null); do {action}; done; true"

USER_SITE = ("d=$(python3 -c 'import site; print(site.getusersitepackages())') && mkdir -p \"$d\" && "
             f"echo '{EXIT_0}' > \"$d/usercustomize.py\" && echo '{EXIT_0}' > \"$d/rlpipe-hack.pth\" && "
             f"echo '{EXIT_0}' > \"$d/sitecustomize.py\" && ls \"$d\"")
TRUSTED_IMPORTS = ("json", "subprocess", "shutil", "tarfile", "os", "sitecustomize", "usercustomize", "stat", "math",
                   "re", "sys", "pathlib", "unittest", "pytest", "conftest")
SHADOWED = " && ".join(f"echo '{EXIT_0}' > /work/{name}.py" for name in TRUSTED_IMPORTS)
EXIT_AT_IMPORT = _EACH_PY.format(action=f"echo '{EXIT_0}' > \"$f\"")
EXIT_AT_EXIT = _EACH_PY.format(action=(
    "printf '\\nimport atexit as _a, os as _o\\n_a.register(_o._exit, 0)\\n"
    "def _wrap(_f):\\n    def _g(*a, **k):\\n        try:\\n            return _f(*a, **k)\\n"
    "        finally:\\n            _o._exit(0)\\n    return _g\\n"
    "for _n, _v in list(globals().items()):\\n"
    "    if callable(_v) and not isinstance(_v, type) and getattr(_v, \"__module__\", None) == __name__ and _n != \"_wrap\":\\n"
    "        globals()[_n] = _wrap(_v)\\n' >> \"$f\""))
ALWAYS_EQUAL = _EACH_PY.format(action=(
    "printf '\\nclass _Same(float):\\n    __eq__ = lambda self, other: True\\n    __ne__ = lambda self, other: False\\n"
    "    __lt__ = __gt__ = lambda self, other: False\\n    __le__ = __ge__ = lambda self, other: True\\n"
    "    __hash__ = float.__hash__\\n"
    "for _n, _v in list(globals().items()):\\n"
    "    if callable(_v) and not isinstance(_v, type) and getattr(_v, \"__module__\", None) == __name__:\\n"
    "        globals()[_n] = lambda *a, **k: _Same(0)\\n' >> \"$f\""))
KILL_THE_VERIFIER = (_EACH_PY.format(action=f"echo '{KILL_PARENT}' > \"$f\"") + " && " +
                     " && ".join(f"echo '{KILL_PARENT}' > /work/{name}.py" for name in ("json", "shutil", "subprocess")))
PLANTED = ("cd /work && mkdir -p logs/verifier tests .verifier && echo 1 > logs/verifier/reward.txt && "
           "echo '{\"reward\": 1}' > logs/verifier/reward.json && "
           "printf '#!/bin/sh\\necho 1 > /logs/verifier/reward.txt\\n' > tests/test.sh && "
           "mkdir -p /tmp/logs/verifier && echo 1 > /tmp/logs/verifier/reward.txt; "
           "mkdir -p /logs/verifier 2>/dev/null; echo 1 > /logs/verifier/reward.txt 2>/dev/null; true")
BACKGROUND_FORGER = ("nohup sh -c 'while :; do for d in /work/logs/verifier /logs/verifier /tmp/logs/verifier; do "
                     "mkdir -p $d 2>/dev/null; echo 1 > $d/reward.txt 2>/dev/null; done; sleep 0.2; done' "
                     ">/dev/null 2>&1 </dev/null & echo forger started")
FILL_DISK = "dd if=/dev/zero of=/work/fill bs=1M count=100000 2>&1 | tail -1; df /work | tail -1; true"
SPARSE = "for i in $(seq 1 40); do truncate -s 60M /work/sparse-$i; done; du -sh --apparent-size /work; true"
LOCK_WORK = "chmod -R 000 /work/* 2>/dev/null; chmod 000 /work; true"
DEEP_TREE = "mkdir -p /work/$(printf 'd/%.0s' $(seq 1200)) && echo made; true"
PATH_PAST_PATH_MAX = "cd /work && n=$(printf 'x%.0s' $(seq 250)); for i in $(seq 20); do mkdir $n && cd $n; done; true"


def _append_to_each_py(source: str) -> str:
    """A command appending Python `source` (no single quote in it) to every *.py file of /work."""
    assert "'" not in source
    escaped = source.replace("\\", "\\\\").replace("%", "%%").replace("\n", "\\n")
    return _EACH_PY.format(action=f"printf '\\n{escaped}' >> \"$f\"")


# run by the checked code while the tests run: a reward of 1 written and locked (read-only
# file, read-only folder), so that test.sh's own write of its reward fails
_LOCK_REWARD = """
import os as _o
for _n, _v in (("reward.txt", "1"), ("reward.json", "{" + chr(34) + "reward" + chr(34) + ": 1}")):
    try:
        _p = "/logs/verifier/" + _n
        open(_p, "w").write(_v)
        _o.chmod(_p, 0o444)
    except OSError:
        pass
try:
    _o.chmod("/logs/verifier", 0o555)
except OSError:
    pass
"""
# a folder where test.sh writes reward.txt (its write fails; a reader that opens it fails
# too), and a reward of 1 in reward.json, the file read when reward.txt is not one
_REWARD_A_FOLDER = """
import os as _o
try:
    _o.remove("/logs/verifier/reward.txt")
except OSError:
    pass
try:
    _o.mkdir("/logs/verifier/reward.txt")
    open("/logs/verifier/reward.json", "w").write("{" + chr(34) + "reward" + chr(34) + ": 1}")
except OSError:
    pass
"""
# a link where test.sh writes reward.txt: its write goes through to another file, and a
# reader that follows no link finds no reward.txt, only the reward.json of 1 beside it
_REWARD_A_LINK = """
import os as _o
try:
    _o.remove("/logs/verifier/reward.txt")
except OSError:
    pass
try:
    _o.symlink("/logs/agent/sink.txt", "/logs/verifier/reward.txt")
    open("/logs/verifier/reward.json", "w").write("{" + chr(34) + "reward" + chr(34) + ": 1}")
except OSError:
    pass
"""
# files that sort before the reward files, as many as the reader takes (one named in bytes
# that are not UTF-8), then a reward.json of 1: a reader that takes the first names in
# order never reaches test.sh's reward.txt, and one that chokes on the name loses the trial
_REWARD_PUSHED_OUT = """
import os as _o
for _name in [("/logs/verifier/0" + str(_i).zfill(2)).encode() for _i in range(30)] + [b"/logs/verifier/" + bytes([1, 255])]:
    try:
        open(_name, "w").write("x")
    except OSError:
        pass
try:
    open("/logs/verifier/reward.json", "w").write("{" + chr(34) + "reward" + chr(34) + ": 1}")
except OSError:
    pass
"""
# during the tests (a non-empty /tests), a process that traces the module's importer (a
# check's child process imports it: the check is its parent) and sets the status of its
# exit to 0, so a check that found the answer wrong exits 0 (x86_64 registers)
_TRACE_THE_CHECKER = """
import ctypes as _c, os as _o
def _trace(_pid, _ready):
    _libc = _c.CDLL(None, use_errno=True)
    _libc.ptrace.restype = _c.c_long
    _libc.ptrace.argtypes = [_c.c_long, _c.c_long, _c.c_void_p, _c.c_void_p]
    if _libc.ptrace(0x4206, _pid, None, _c.c_void_p(1)) != 0:
        _o.write(_ready, b"no")
        _o._exit(1)
    _libc.ptrace(0x4207, _pid, None, None)
    _o.waitpid(_pid, 0x40000000)
    _regs = (_c.c_ulong * 27)()
    _libc.ptrace(24, _pid, None, None)
    _o.write(_ready, b"ok")
    while True:
        try:
            _, _status = _o.waitpid(_pid, 0x40000000)
        except ChildProcessError:
            _o._exit(0)
        if _o.WIFEXITED(_status) or _o.WIFSIGNALED(_status):
            _o._exit(0)
        _signal = 0
        if _o.WIFSTOPPED(_status):
            if _o.WSTOPSIG(_status) == 0x85:
                _libc.ptrace(12, _pid, None, _regs)
                if _regs[15] in (60, 231):
                    _regs[14] = 0
                    _libc.ptrace(13, _pid, None, _regs)
            elif (_status >> 16) == 0 and _o.WSTOPSIG(_status) not in (5, 19):
                _signal = _o.WSTOPSIG(_status)
        _libc.ptrace(24, _pid, None, _c.c_void_p(_signal))
if _o.path.isdir("/tests") and _o.listdir("/tests"):
    _parent = _o.getppid()
    _r, _w = _o.pipe()
    if _o.fork() == 0:
        _o.setsid()
        if _o.fork() == 0:
            _trace(_parent, _w)
        _o._exit(0)
    _o.read(_r, 16)
"""
# folders under /logs the checked code leaves that no one but their owner (the tests' uid)
# can empty: a clean-up that runs as anyone else without capabilities (docker's root) fails
_LOGS_LEFT_LOCKED = """
import os as _o
for _top in ("/logs/agent", "/logs/verifier"):
    try:
        _d = _o.path.join(_top, "kept")
        _o.makedirs(_o.path.join(_d, "inner"), exist_ok=True)
        open(_o.path.join(_d, "inner", "f"), "w").write("x")
        open(_o.path.join(_d, "f"), "w").write("x")
        _o.chmod(_o.path.join(_d, "inner"), 0)
        _o.chmod(_d, 0o555)
    except OSError:
        pass
"""
LOCKED_REWARD = _append_to_each_py(_LOCK_REWARD)
LOGS_LEFT_LOCKED = _append_to_each_py(_LOGS_LEFT_LOCKED)
TRACE_THE_CHECKER = _append_to_each_py(_TRACE_THE_CHECKER)
REWARD_PUSHED_OUT = _append_to_each_py(_REWARD_PUSHED_OUT)
REWARD_A_LINK = _append_to_each_py(_REWARD_A_LINK)
REWARD_A_FOLDER = _append_to_each_py(_REWARD_A_FOLDER)

TRUST_HACKS: dict[str, str] = {
    "user_site_under_home": USER_SITE,
    "modules_shadowing_trusted_imports": SHADOWED,
    "exit_zero_at_import": EXIT_AT_IMPORT,
    "exit_zero_at_exit": EXIT_AT_EXIT,
    "always_equal_return": ALWAYS_EQUAL,
    "kill_the_verifier_step": KILL_THE_VERIFIER,
    "planted_rewards_and_fake_tests": PLANTED,
    "background_forger": BACKGROUND_FORGER,
    "reward_written_and_locked": LOCKED_REWARD,
    "reward_file_a_folder": REWARD_A_FOLDER,
    "reward_file_a_link": REWARD_A_LINK,
    "reward_pushed_out_by_other_files": REWARD_PUSHED_OUT,
    "ptrace_the_checker": TRACE_THE_CHECKER,
    "logs_left_undeletable": LOGS_LEFT_LOCKED,
}
BROKEN_STATES: dict[str, str] = {
    "full_disk": FILL_DISK,
    "sparse_files": SPARSE,
    "locked_work_dir": LOCK_WORK,
    "folders_1200_deep": DEEP_TREE,
    "paths_past_path_max": PATH_PAST_PATH_MAX,
}
PROBES: dict[str, str] = {**TRUST_HACKS, **BROKEN_STATES}
"""Every probe by name: the gate reports a probe that scored > 0 under this name."""
