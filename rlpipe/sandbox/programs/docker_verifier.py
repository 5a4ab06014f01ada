"""What the docker backend runs as root in its container around a task's tests (stdlib only).

Sent as `python3 -I -S -c <this file> ACTION` (isolated: no user site, no cwd on the path,
no PYTHON* variables, so nothing the agent left in /work is imported), by a `docker exec`
as uid 0 without capabilities: root owns /tests and /logs (tmpfs mounts of the container,
mode 0755), so the sandbox user (1000) can read them but neither add, remove nor rename
an entry in them.

    setup   stdin: an 8-byte length N, N bytes of framed files (docker_work.frames) for the
            tests runtime, then the tests' framed files. The runtime's go under
            /.rlpipe-tests (sandbox/tests_runtime.py), mode 0755, unless it is there
            already (once per container); /tests and /logs are emptied, the tests written
            under /tests, mode 0755 (readable and runnable, writable by root only), and
            /logs/verifier and /logs/agent made, mode 0777 (the tests run as the sandbox user)
    logs    the files directly in /logs/verifier, framed on stdout, reward.txt and
            reward.json first: no symlink followed, an entry that is no regular file sent
            with no content, at most LOG_BYTES each, MAX_FILES files; then /tests and /logs
            emptied, as `clear` does
    clear   empty /tests and /logs (where `logs` did not run)

One exec each (a `docker exec` costs ~60 ms of the engine's CPU): setup before the tests,
logs after them.

What it does not: run the tests (the backend's exec does, as the sandbox user, and kills
every process of that user before `logs` runs).
"""

import os
import stat
import sys

TESTS, LOGS, RUNTIME = "/tests", "/logs", "/.rlpipe-tests"
LOG_BYTES = 64 * 1024
MAX_FILES = 32
REWARD_FILES = ("reward.txt", "reward.json")


def clear():
    for top in (TESTS, LOGS):
        for name in os.listdir(top):
            _remove(os.path.join(top, name))


def _remove(path):
    if os.path.isdir(path) and not os.path.islink(path):
        for name in os.listdir(path):
            _remove(os.path.join(path, name))
        os.rmdir(path)
    else:
        os.unlink(path)


def setup(data):
    runtime_size = int.from_bytes(data[:8], "big")
    if 8 + runtime_size > len(data):
        sys.exit(f"docker_verifier: the runtime's {runtime_size} bytes run past the input ({len(data)} bytes)")
    if not os.listdir(RUNTIME):
        _unpack(data[8:8 + runtime_size], RUNTIME)
    clear()
    _unpack(data[8 + runtime_size:], TESTS)
    for name in ("verifier", "agent"):
        os.mkdir(os.path.join(LOGS, name))
        os.chmod(os.path.join(LOGS, name), 0o777)


def _unpack(data, top):
    at = 0
    while at < len(data):
        path_size, data_size = int.from_bytes(data[at:at + 4], "big"), int.from_bytes(data[at + 4:at + 12], "big")
        if at + 12 + path_size + data_size > len(data):
            sys.exit(f"docker_verifier: a frame runs past the end of the input ({len(data)} bytes)")
        relative = data[at + 12:at + 12 + path_size].decode()
        at += 12 + path_size
        if relative.startswith("/") or ".." in relative.split("/"):
            sys.exit(f"docker_verifier: a file path leaves {top}: {relative!r}")
        path = os.path.join(top, relative)
        os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
        with open(path, "wb") as stream:
            stream.write(data[at:at + data_size])
        os.chmod(path, 0o755)
        at += data_size


def logs(out):
    try:
        folder_fd = os.open(os.path.join(LOGS, "verifier"), os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:
        return
    names = os.listdir(folder_fd)
    first = [name for name in REWARD_FILES if name in names]  # no number of other files pushes them out
    for name in first + sorted(set(names) - set(first))[:MAX_FILES - len(first)]:
        content = b""  # a symlink, folder, FIFO or device: listed with no content (a reward.txt that is no file reads as none)
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=folder_fd)
        except OSError:
            fd = None
        if fd is not None and not stat.S_ISREG(os.fstat(fd).st_mode):  # a folder opens too; fdopen would raise on it
            os.close(fd)
        elif fd is not None:
            with os.fdopen(fd, "rb") as handle:
                content = handle.read(LOG_BYTES)
        encoded = name.encode("utf-8", "surrogateescape")
        out.write(len(encoded).to_bytes(4, "big") + len(content).to_bytes(8, "big") + encoded + content)


def main(argv):
    action = argv[0]
    if action == "setup":
        setup(sys.stdin.buffer.read())
    elif action == "logs":
        logs(sys.stdout.buffer)
        sys.stdout.buffer.flush()
        clear()
    elif action == "clear":
        clear()
    else:
        sys.exit(f"docker_verifier: unknown action {action!r}")


if __name__ == "__main__":  # as `python3 -c` runs it: argv[0] is "-c"
    main(sys.argv[1:])
