"""What the docker backend runs in its container on the sandbox's files and state (stdlib only).

Sent as `python3 -S -c <programs/cleanup.py + programs/extents.py + this file> ACTION ARGS`
(programs/__init__.py),
as the sandbox user, by `docker exec` or as a request to the container's warm server:

    wipe DIR...     give /work's root back its mode (0700), no extended attributes (ACLs
                    among them) and zero times, empty each DIR that exists (iteratively),
                    remove every System V IPC object; exit 1 with a message if something
                    is left (the backend then replaces the container)
    unpack DIR...   `wipe DIR...` (with no DIR: /work's root and the IPC objects only), then
                    write the framed files on stdin under /work (4-byte path length, 8-byte
                    data length, path, data; parents made, a symlink in the way replaced)
    tar             a tar stream of /work's entries on stdout (sorted by name); a file with
                    holes is a GNU sparse 1.0 member (its data extents only, extents.py),
                    hard links are links; exit 3 with a message when the tree cannot be
                    read (what the sandboxed code did to it: modes, depth, name length)
    untar           unpack a tar stream from stdin into /work (sparse members with their holes)
    cat PATH [MAX]  the bytes of one file on stdout (at most MAX)
    oom-count       the cgroup's oom_kill counter (v1 or v2), -1 when neither is readable

What it does not: decide when to wipe or check paths (docker_backend.py does both).
"""

import errno
import os
import stat
import sys

if __name__ != "__main__":  # imported (rlpipe, tests); in a sandbox cleanup.py's and extents.py's text come above this one
    from rlpipe.sandbox.programs.cleanup import empty_dir, remove_ipc_objects
    from rlpipe.sandbox.programs.extents import data_extents

WORK = "/work"
TREE_UNREADABLE = 3  # the exit code of `tar` when the tree itself cannot be read
PATH_REFUSED = 4  # the exit code of `unpack` when the work dir refuses a file (a file where a folder must go, full)
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
    """A tar stream of `work`'s entries; files with holes as GNU sparse 1.0 members (data only)."""
    import tarfile

    with tarfile.open(fileobj=stream, mode="w|", format=tarfile.PAX_FORMAT) as archive:
        for name in sorted(os.listdir(work)):
            _add(archive, os.path.join(work, name), name)


def _add(archive, path, arcname):
    info = archive.gettarinfo(path, arcname)
    if info is None:  # a socket: not part of a work state
        return
    if info.isreg():
        with open(path, "rb") as source:
            extents = data_extents(source.fileno(), info.size)
            if sum(length for _, length in extents) == info.size:
                source.seek(0)  # finding the extents moved the offset
                archive.addfile(info, source)
            else:
                _add_sparse(archive, info, source.fileno(), extents)
    elif info.isdir():
        archive.addfile(info)
        for name in sorted(os.listdir(path)):
            _add(archive, os.path.join(path, name), arcname + "/" + name)
    else:  # symlinks, hard links to a file already added, FIFOs, devices
        archive.addfile(info)


def _add_sparse(archive, info, fd, extents):
    """GNU sparse 1.0 (what tarfile reads): pax records name the format and the real size; the
    member's data is the map ("count\noffset\nlength\n...", padded to a block), then the extents."""
    numbers = [len(extents)] + [number for extent in extents for number in extent]
    head = "".join(f"{number}\n" for number in numbers).encode()
    head += b"\0" * (-len(head) % 512)
    info.pax_headers = {"GNU.sparse.major": "1", "GNU.sparse.minor": "0", "GNU.sparse.name": info.name,
                        "GNU.sparse.realsize": str(info.size)}
    info.size = len(head) + sum(length for _, length in extents)
    archive.addfile(info, _SparseData(head, fd, extents))


class _SparseData:
    """The stored data of a sparse member, read as tarfile's copy reads a file (full reads until the end)."""

    def __init__(self, head, fd, extents):
        self._head, self._fd, self._extents, self._at = head, fd, list(extents), 0

    def read(self, size):
        out = bytearray(self._head[:size])
        self._head = self._head[len(out):]
        while len(out) < size and self._extents:
            start, length = self._extents[0]
            chunk = os.pread(self._fd, min(size - len(out), length - self._at), start + self._at)
            if not chunk:
                raise OSError("a file shrank while it was archived")
            out += chunk
            self._at += len(chunk)
            if self._at == length:
                self._extents.pop(0)
                self._at = 0
        return bytes(out)


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
            try:
                unpack(sys.stdin.buffer.read())
            except OSError as exc:  # the tree the sandboxed code made refuses it: not the host's failure
                sys.stderr.write(f"{type(exc).__name__}: {exc}\n")
                sys.exit(PATH_REFUSED)
    elif action == "tar":
        try:
            write_tar(sys.stdout.buffer)
        except (PermissionError, RecursionError) as exc:  # what the code did to its tree: modes, depth
            sys.stderr.write(f"the work dir cannot be archived: {type(exc).__name__}: {exc}\n")
            sys.exit(TREE_UNREADABLE)
        except OSError as exc:
            if exc.errno not in (errno.ENAMETOOLONG, errno.ELOOP):
                raise
            sys.stderr.write(f"the work dir cannot be archived: {exc}\n")
            sys.exit(TREE_UNREADABLE)
    elif action == "untar":
        read_tar(sys.stdin.buffer)
    elif action == "cat":  # a regular file only, as bwrap's read_beneath: a FIFO would block, a link leads elsewhere
        fd = os.open(args[0], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            sys.exit(f"{args[0]} is not a regular file")
        with os.fdopen(fd, "rb") as source:
            sys.stdout.buffer.write(source.read(int(args[1])) if len(args) > 1 else source.read())
    elif action == "oom-count":
        print(oom_count())
    else:
        sys.exit(f"docker_work: unknown action {action!r}")


if __name__ == "__main__":  # as `python3 -c` runs it: argv[0] is "-c"
    main(sys.argv[1:])
