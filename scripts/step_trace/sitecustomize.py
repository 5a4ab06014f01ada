"""Which rlpipe files run code, per process: imported at start-up by every Python process
whose PYTHONPATH holds this folder (the CLI, the zygote, the workers it forks), it records
the files under rlpipe/ whose functions are called (sys.settrace call events, no line
events; a module's or class's body running at import does not count)
while $RLPIPE_STEP_TRACE names a folder, into that folder, one file per process:
`all` lines for any call, `step` lines for calls while one RL step runs.

"While one step runs": the controller marks the folder (a file `in-step`) when
`rlpipe.flows.steps.rl_step` is entered and removes the mark when it returns; every process
looks at the mark at most every 20 ms. So a worker's calls count as the step's while the
controller is inside `rl_step`. Used by scripts/trace_step.py; not part of rlpipe.
Without $RLPIPE_STEP_TRACE it does nothing.
"""

import os
import sys
import threading
import time

_FOLDER = os.environ.get("RLPIPE_STEP_TRACE")
_PACKAGE = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "rlpipe") + os.sep


NEWLOCALS = 0x2  # inspect.CO_NEWLOCALS: set for functions, not for module or class bodies


def _install(folder: str) -> None:
    mark = os.path.join(folder, "in-step")
    state = {"seen": set(), "step": set(), "checked": 0.0, "in_step": False, "out": None}
    relevant: dict[str, str | None] = {}  # co_filename -> path under rlpipe/ (None: not rlpipe's)

    def reset_in_child() -> None:  # a forked worker writes its own file
        state.update(seen=set(), step=set(), out=None)

    def record(kind: str, path: str) -> None:
        if state["out"] is None:
            state["out"] = os.path.join(folder, f"{os.getpid()}.txt")
        with open(state["out"], "a") as out:
            out.write(f"{kind} {path}\n")

    def in_step() -> bool:
        now = time.monotonic()
        if now - state["checked"] > 0.02:
            state["checked"], state["in_step"] = now, os.path.exists(mark)
        return state["in_step"]

    def on_call(frame, event, arg):  # noqa: ANN001 - sys.settrace's signature
        if not frame.f_code.co_flags & NEWLOCALS:  # a module's or class's body: an import, not a call
            return None
        filename = frame.f_code.co_filename
        path = relevant.get(filename, "")
        if path == "":
            full = os.path.abspath(filename)
            path = relevant[filename] = full[len(_PACKAGE) - len("rlpipe/"):] if full.startswith(_PACKAGE) else None
        if path is None:
            return None
        if path not in state["seen"]:
            state["seen"].add(path)
            record("all", path)
        if path not in state["step"] and in_step():
            state["step"].add(path)
            record("step", path)
        if frame.f_code.co_name == "rl_step" and path == "rlpipe/flows/steps.py":
            open(mark, "w").close()
            state["in_step"], state["checked"] = True, time.monotonic()

            def on_step_event(frame, event, arg):  # noqa: ANN001
                if event == "return":
                    os.unlink(mark)
                    state["in_step"], state["checked"] = False, time.monotonic()
                return on_step_event

            return on_step_event
        return None

    os.register_at_fork(after_in_child=reset_in_child)
    sys.settrace(on_call)
    threading.settrace(on_call)


if _FOLDER:
    _install(_FOLDER)
