"""The adversarial programs of the sandbox self-test, as Python source run with `python3 -c`.

Each prints one JSON line that the matching check in selftest.py reads. They are plain
data: nothing here runs on the host.
"""

from __future__ import annotations

FORK_BOMB = """
import json, os, time
forks = 0
error = ""
try:
    while forks < 100_000:
        if os.fork() == 0:
            time.sleep(30)
            os._exit(0)
        forks += 1
except OSError as exc:
    error = exc.strerror
print(json.dumps({"forks": forks, "error": error}), flush=True)
os._exit(0)
"""

MEMORY_BOMB = """
import sys
chunks = []
target_mb = int(sys.argv[1])
for _ in range(target_mb):
    chunks.append(b"x" * (1 << 20))  # touched, so it is resident
print("allocated", target_mb, "MB", flush=True)
"""

DISK_FILL = """
import json, os
written = {}
for directory in ("/work", "/tmp"):
    total = 0
    try:
        for index in range(100_000):
            with open(f"{directory}/fill-{index}", "wb") as handle:
                for _ in range(4):
                    handle.write(b"\\0" * (1 << 20))
                    total += 1 << 20
    except OSError as exc:
        written[directory + "_error"] = exc.strerror
    written[directory] = total
    for name in os.listdir(directory):
        if name.startswith("fill-"):
            os.unlink(f"{directory}/{name}")
print(json.dumps(written), flush=True)
"""

INFINITE_LOOP = "while True:\n    pass\n"

SLEEP_FOREVER = "import time\ntime.sleep(10**9)\n"

NETWORK_EGRESS = """
import json, socket, sys
port = int(sys.argv[1])
outcome = {"interfaces": [name for _, name in socket.if_nameindex()]}
try:
    with socket.create_connection(("127.0.0.1", port), timeout=2) as connection:
        connection.sendall(b"escaped")
        outcome["connected"] = True
except OSError as exc:
    outcome["connected"] = False
    outcome["error"] = str(exc)
print(json.dumps(outcome), flush=True)
"""

WRITE_OUTSIDE = """
import json, sys
marker = sys.argv[1]
written = []
for path in ["/usr/" + marker, "/etc/" + marker, "/" + marker, "/bin/" + marker, "/proc/sys/kernel/hostname",
             "/dev/" + marker]:
    try:
        with open(path, "w") as handle:
            handle.write("escaped")
        written.append(path)
    except OSError:
        pass
with open("/tmp/" + marker, "w") as handle:  # the sandbox's own /tmp: allowed, must not reach the host
    handle.write("inside")
print(json.dumps({"written": written}), flush=True)
"""

READ_HOST_FILES = """
import json, os, sys
readable = []
for path in sys.argv[1:]:
    try:
        if os.path.isdir(path):
            os.listdir(path)
        else:
            open(path, "rb").read(1)
        readable.append(path)
    except OSError:
        pass
print(json.dumps({"readable": readable}), flush=True)
"""

PRINT_ENVIRONMENT = "import json, os\nprint(json.dumps(dict(os.environ)), flush=True)\n"

HUGE_STDOUT = """
import os
block = b"a" * (1 << 20)
for _ in range(100):
    os.write(1, block)
"""

DOUBLE_FORK = """
import os, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        for _ in range(600):
            with open("/work/heartbeat", "a") as handle:
                handle.write(".")
            time.sleep(0.05)
        os._exit(0)
    os._exit(0)
time.sleep(0.3)  # let the grandchild start beating
"""

PLANT_SYMLINKS = """
import os
os.symlink("/etc/hostname", "/work/read-me")
os.symlink("/tmp", "/work/dir-link")
"""

EXIT_CODE_PROGRAMS = {
    "sys.exit(0)": ("import sys\nprint('FAILED')\nsys.exit(0)\n", 0),
    "os._exit(0)": ("import os\nprint('FAILED', flush=True)\nos._exit(0)\n", 0),
    "sys.exit(7)": ("import sys\nsys.exit(7)\n", 7),
    "os._exit(42)": ("import os\nos._exit(42)\n", 42),
    "raise": ("raise AssertionError('test failed')\n", 1),
}
