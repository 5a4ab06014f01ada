"""The docker sandbox container's pid 1: a reaper that nothing in the sandbox can touch.

Run as the container's command, `python3 -S -c <this file>`, as nobody (65534): it makes
itself not dumpable (no process of the sandbox can ptrace it or read /proc/1/mem), then
reaps every orphan until SIGTERM. Commands (uid 1000) cannot signal it.

What it does not: start or watch commands (they come by `docker exec`).
"""

import os
import signal


def main():
    try:  # not dumpable: no process of the sandbox can ptrace it or read /proc/1/mem (it runs as nobody anyway)
        import ctypes

        ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)
    except Exception:
        pass
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD, signal.SIGTERM})
    while signal.sigwait({signal.SIGCHLD, signal.SIGTERM}) == signal.SIGCHLD:
        try:
            while os.waitpid(-1, os.WNOHANG)[0]:
                pass
        except ChildProcessError:
            pass


if __name__ == "__main__":  # as `python3 -c` runs it
    main()
