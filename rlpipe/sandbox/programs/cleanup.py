"""Emptying dirs and removing System V IPC objects inside a sandbox (stdlib only).

One copy, used by both in-sandbox programs that clean up: the warm server after every
request (warm_server.py: /tmp, /dev/shm, /dev/mqueue and the IPC objects) and the docker
backend's wipe (docker_work.py: /work too). Sent into the sandbox as text above the
program that uses it (programs/__init__.py); imported as a module by rlpipe and the tests.

What it does not: decide what to empty, or report; callers turn False into "residue" (the
warm server) or a failed wipe (docker: the container is replaced).
"""

import ctypes
import os

SYSV_IPC_TABLES = ("/proc/sysvipc/shm", "/proc/sysvipc/msg", "/proc/sysvipc/sem")
_IPC_RMID = 0


def remove_tree(path):
    """Delete a file or a whole tree without recursion (a command may nest dirs thousands
    deep); each dir is given mode 0700 first (a command may have taken its permissions
    away). True if all of it is gone."""
    pending = [(path, False)]
    try:
        while pending:
            current, emptied = pending.pop()
            if emptied or not os.path.isdir(current) or os.path.islink(current):
                os.rmdir(current) if emptied else os.unlink(current)
                continue
            os.chmod(current, 0o700)
            pending.append((current, True))
            pending.extend((os.path.join(current, name), False) for name in os.listdir(current))
        return True
    except (OSError, RecursionError, MemoryError):
        return False


def empty_dir(top):
    """Delete everything under `top` (kept, its times set to 0: they could carry bits to the
    next command); True if nothing is left or `top` does not exist, False if something
    could not be deleted or `top` cannot be listed."""
    try:
        names = os.listdir(top)
    except FileNotFoundError:
        return True
    except OSError:  # e.g. a command took the permissions away
        return False
    clean = True
    for name in names:
        clean = remove_tree(os.path.join(top, name)) and clean
    try:
        os.utime(top, ns=(0, 0))
    except OSError:
        pass
    return clean


def ipc_ids(table):
    """The ids in one /proc/sysvipc table (a header line, then one line per object)."""
    try:
        with open(table) as entries:
            return [int(line.split()[1]) for line in entries.read().strip().splitlines()[1:]]
    except (OSError, ValueError, IndexError):
        return []


def remove_ipc_objects(libc=None):
    """Remove every System V IPC object of the IPC namespace (a fresh sandbox has none; they
    live as long as the namespace and are charged to its memory); the tables still holding one."""
    libc = libc if libc is not None else ctypes.CDLL(None, use_errno=True)
    left = []
    for table in SYSV_IPC_TABLES:
        for ident in ipc_ids(table):
            if table.endswith("sem"):
                libc.semctl(ident, 0, _IPC_RMID)
            elif table.endswith("shm"):
                libc.shmctl(ident, _IPC_RMID, None)
            else:
                libc.msgctl(ident, _IPC_RMID, None)
        if ipc_ids(table):
            left.append(table)
    return left
