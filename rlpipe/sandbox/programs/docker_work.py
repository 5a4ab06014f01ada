"""What the docker backend runs in its container on the sandbox's files and state (stdlib only).

Sent as `python3 -S -c <programs/cleanup.py + this file> ACTION ARGS` (programs/__init__.py),
as the sandbox user, by `docker exec` or as a request to the container's warm server:

    wipe DIR...     give /work's root back its mode (0700), no extended attributes (ACLs
                    among them) and zero times, empty each DIR that exists (iteratively),
                    remove every System V IPC object; exit 1 with a message if something
                    is left (the backend then replaces the container)
    unpack DIR...   `wipe DIR...` (with no DIR: /work's root and the IPC objects only), then
                    write the framed files on stdin under /work (4-byte path length, 8-byte
                    data length, path, data; parents made, a symlink in the way replaced)
    tar             a tar stream of /work's entries on stdout (sorted by name)
    untar           unpack a tar stream from stdin into /work
    cat PATH        the bytes of one file on stdout
    oom-count       the cgroup's oom_kill counter (v1 or v2), -1 when neither is readable

What it does not: decide when to wipe or check paths (docker_backend.py does both).
"""

import os
import sys

if __name__ != "__main__":  # imported (rlpipe, tests); in a sandbox cleanup.py's text comes above this one
    from rlpipe.sandbox.programs.cleanup import empty_dir, remove_ipc_objects

WORK = "/work"
_OOM_COUNTERS = (("/sys/fs/cgroup/memory/memory.oom_control", "oom_kill"), ("/sys/fs/cgroup/memory.events", "oom_kill"))


def wipe(dirs, work=WORK):
    """Restore `work`'s root (a command may have locked it with chmod 0 or left a default ACL
    for the next user), empty `dirs`, remove the IPC objects; what is left, as messages."""
    for name in os.listxattr(work):
        os.removexattr(work, name)
    os.chmod(work, 0o700)
    left = [f"{top} could not be emptied" for top in dirs if not empty_dir(top)]
    os.utime(work, ns=(0, 0))
    return left + [f"System V IPC objects left in {table}" for table in remove_ipc_objects()]


def unpack(data, work=WORK):
    """Write the framed files of `data` under `work`."""
    at = 0
    while at < len(data):
        path_size, data_size = int.from_bytes(data[at:at + 4], "big"), int.from_bytes(data[at + 4:at + 12], "big")
        path = os.path.join(work, data[at + 12:at + 12 + path_size].decode())
        at += 12 + path_size
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if os.path.islink(path):
            os.unlink(path)
        with open(path, "wb") as stream:
            stream.write(data[at:at + data_size])
        at += data_size


def frames(files):
    """The framed form `unpack` reads, of {relative path: bytes}."""
    out = bytearray()
    for path, data in files.items():
        encoded = path.encode()
        out += len(encoded).to_bytes(4, "big") + len(data).to_bytes(8, "big") + encoded + data
    return bytes(out)


def write_tar(stream, work=WORK):
    import tarfile

    with tarfile.open(fileobj=stream, mode="w|") as archive:
        for name in sorted(os.listdir(work)):
            archive.add(os.path.join(work, name), arcname=name)


def read_tar(stream, work=WORK):
    import tarfile

    tarfile.open(fileobj=stream, mode="r|").extractall(work)


def oom_count():
    """The cgroup's oom_kill counter, -1 when no counter is readable."""
    for path, key in _OOM_COUNTERS:
        try:
            with open(path) as counters:
                return int(dict(line.split() for line in counters)[key])
        except (OSError, KeyError, ValueError):
            pass
    return -1


def main(argv):
    action, args = argv[0], argv[1:]
    if action in ("wipe", "unpack"):
        left = wipe(args)
        if left:
            sys.exit("; ".join(left))
        if action == "unpack":
            unpack(sys.stdin.buffer.read())
    elif action == "tar":
        write_tar(sys.stdout.buffer)
    elif action == "untar":
        read_tar(sys.stdin.buffer)
    elif action == "cat":
        with open(args[0], "rb") as source:
            sys.stdout.buffer.write(source.read())
    elif action == "oom-count":
        print(oom_count())
    else:
        sys.exit(f"docker_work: unknown action {action!r}")


if __name__ == "__main__":  # as `python3 -c` runs it: argv[0] is "-c"
    main(sys.argv[1:])
