"""What the warm server (sandbox/warm_server.py) does and checks after each request (stdlib only).

After a request the server ends every other process of the namespace (`kill_all_others`),
empties the scratch dirs (`empty_scratch`: /tmp, /dev/shm, /dev/mqueue) and compares what
a same-uid process may have changed on the server or in the namespace with what it was at
the server's start (`baseline_state`, then `residue`): its rlimits, nice, affinity,
scheduler, I/O priority and autogroup, System V IPC objects it could not remove, keys in a
keyring, the scratch dirs' modes, owners and extended attributes (ACLs), and the
namespaces' writable sysctls. Anything `residue` names retires the server (warm_server.py's
docstring says why each of these matters).

Sent into the sandbox as text between programs/cleanup.py's and warm_server.py's
(programs/__init__.py); imported as a module by rlpipe and the tests.

What it does not: run requests, speak the protocol (warm_server.py), or decide what to do
with a residue (the host side, sandbox/warm_python.py and the backends, retire the server).
"""

import os
import resource
import signal
import time

if __name__ != "__main__":  # imported (tests, tools); in a sandbox programs/cleanup.py's text comes above this one
    from rlpipe.sandbox.programs.cleanup import empty_dir, remove_ipc_objects

_SCRATCH_DIRS = ("/tmp", "/dev/shm", "/dev/mqueue")
# paths whose mode, owner and extended attributes (ACLs) a request could change for later ones
_WATCHED_PATHS = (*_SCRATCH_DIRS, "/dev/pts", "/dev/pts/ptmx")
# sysctls of the sandbox's own IPC and pid namespaces, writable from inside (ns_last_pid moves by itself)
_NAMESPACE_SYSCTLS = tuple(f"/proc/sys/kernel/{name}" for name in (
    "msgmni", "msgmax", "msgmnb", "sem", "shmmax", "shmall", "shmmni", "shm_rmid_forced", "auto_msgmni", "pid_max"))
_IOPRIO_GET = {"x86_64": 252, "aarch64": 31}  # syscall numbers; elsewhere the I/O priority is not checked
_RLIMITS = sorted(getattr(resource, name) for name in dir(resource) if name.startswith("RLIMIT_"))
ORPHANS_GONE_S = 2.0


def baseline_state(libc):
    """What `residue` compares with: taken once, when the server starts."""
    return {"settings": process_settings(libc), "keys": keys_in_view(), "namespace": namespace_state()}


def process_settings(libc):
    """What another process of the same uid may change on this one, and every later fork would inherit."""
    ioprio_get = _IOPRIO_GET.get(os.uname().machine)
    return {
        "rlimits": [resource.getrlimit(which) for which in _RLIMITS],
        "nice": os.getpriority(os.PRIO_PROCESS, 0),
        "affinity": sorted(os.sched_getaffinity(0)),
        "scheduler": [os.sched_getscheduler(0), os.sched_getparam(0).sched_priority],
        "ioprio": libc.syscall(ioprio_get, 1, 0) if ioprio_get else None,  # IOPRIO_WHO_PROCESS, self
        "autogroup": read_text("/proc/self/autogroup"),
    }


def read_text(path):
    try:
        with open(path) as handle:
            return handle.read()
    except OSError:
        return None


def namespace_state():
    """Modes, owners and xattrs of the watched paths, and the namespaces' writable sysctls."""
    paths = {}
    for path in _WATCHED_PATHS:
        try:
            info = os.stat(path, follow_symlinks=False)
            paths[path] = (info.st_mode, info.st_uid, info.st_gid, sorted(os.listxattr(path, follow_symlinks=False)))
        except OSError:
            paths[path] = None
    mqueue = "/proc/sys/fs/mqueue"
    sysctls = [*_NAMESPACE_SYSCTLS, *(os.path.join(mqueue, name) for name in sorted(os.listdir(mqueue)))] \
        if os.path.isdir(mqueue) else list(_NAMESPACE_SYSCTLS)
    return {"paths": paths, "sysctls": {path: read_text(path) for path in sysctls}}


def keys_in_view():
    try:
        with open("/proc/keys") as keys:
            return {line.split(None, 1)[0] for line in keys if line.strip()}
    except OSError:
        return set()


def residue(baseline, libc):
    """What a finished request left behind beyond /tmp: changed server settings, IPC objects it
    could not remove, keys, changed scratch dirs or sysctls.

    A fresh sandbox has none of these; a non-empty answer retires the server.
    """
    found = []
    settings = process_settings(libc)
    found += [f"server {name} changed" for name, value in settings.items() if value != baseline["settings"][name]]
    found += [f"System V IPC objects left in {table}" for table in remove_ipc_objects(libc)]
    if keys_in_view() - baseline["keys"]:
        found.append("keys left in a keyring")
    state = namespace_state()
    found += [f"{path} changed (mode, owner or xattrs)" for path, value in state["paths"].items()
              if value != baseline["namespace"]["paths"].get(path)]
    found += [f"sysctl {path} changed" for path, value in state["sysctls"].items()
              if value != baseline["namespace"]["sysctls"].get(path)]
    return found


def kill_all_others(not_init):
    """SIGKILL and reap every process of the namespace but this one (pid 1); False if one is left.

    `not_init` (the server's `--not-init`): pid 1 is spared too and reaps the orphans, so wait
    until they are gone.
    """
    while True:
        try:
            os.kill(-1, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            return others_gone() if not_init else True


def others_gone():
    """Kill until no process but pid 1 and this one is left (at most ORPHANS_GONE_S); whether none is."""
    deadline = time.monotonic() + ORPHANS_GONE_S
    spared = {"1", str(os.getpid())}
    while any(name.isdigit() and name not in spared for name in os.listdir("/proc")):
        if time.monotonic() > deadline:
            return False
        try:
            os.kill(-1, signal.SIGKILL)
        except ProcessLookupError:
            pass
        time.sleep(0.001)
    return True


def empty_scratch():
    """Delete everything under the scratch dirs; False if something could not be deleted."""
    clean = True
    for top in _SCRATCH_DIRS:
        clean = empty_dir(top) and clean
    return clean
