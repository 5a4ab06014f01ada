"""The code env's harness: runs in a sandbox, tests a solution that lives in another process.

Its text, below code_wire.py's (the plain-data encoding and framing), is run as
`python3 -I -S -c TEXT` by `Sandbox.exec_python` (stdlib only: rlpipe is not installed in
a sandbox). envs/code.py builds its stdin and reads its verdict.

Two processes, one trusted and one not:
- the *harness* (this process, trusted) makes itself non-dumpable (no process of the same
  uid can ptrace it, read /proc/<pid>/mem, or open /proc/<pid>/fd/*), reads the public part
  of its stdin (the entry point, the dataset's prompt, the solution's text), runs the prompt
  in the tests' own namespace (for helpers the tests use, such as HumanEval/38's
  `encode_cyclic`), and only then forks the *solution process*;
- the solution process, before any of the solution's code runs, points fds 0-2 at
  /dev/null and closes every other fd but its two protocol pipes; it runs the solution and
  serves calls: each call's arguments and each return value cross the pipes as plain data
  (`encode`: JSON of None, bool, int, float, str, list, and tagged tuple, dict, set,
  frozenset, bytes, complex), never objects or pickles;
- after the fork, the harness reads the secret part of its stdin (the nonce and the tests),
  which the solution process therefore never has in its memory; the tests run here with
  `candidate` (and the entry point's name) bound to `RemoteFunction`, which sends the
  arguments and rebuilds the answer with `decode`: fresh objects of the exact built-in
  types, whatever the solution sent; only then `check` compares them, with this process's
  own builtins, and only this process writes `<nonce> <status>` on its stdout.

The solution's side encodes with the exact types: a subclass of int, float, str or bytes,
or any object that is not plain data, is an error there ("not plain data"); a subclass of
list, tuple, dict, set or frozenset (Counter, OrderedDict, a namedtuple) crosses as its
base type's contents, read with the base type's own methods. The solution can change that
encoder in its own process: whatever it sends is decoded here into plain data or refused.

Statuses: ok; wrong (an assertion of the tests failed, or the solution's process exited
with status 0 before the tests finished); format (does not compile, lacks the entry
point); crash (any other exception, on either side; the solution's process died or broke
the protocol); oom (a MemoryError on either side). The exit status is 0 only for ok.
What it does not protect against is in docs/SANDBOX.md ("Code verification").
"""
import json
import os
import signal
import sys

if __name__ != "__main__":  # imported (rlpipe, tests); in a sandbox code_wire.py's text comes above this one
    from rlpipe.envs.code_wire import (HEADER_BYTES, decode, describe, dumps, encode, literal_calls, read_exact,
                                       read_frame, write_frame)

PREFETCH_BYTES = 60_000  # the first message fits in an empty pipe (64 KiB), so writing it never blocks
_PR_SET_DUMPABLE = 4
_ONLY_AST = 0x400  # ast.PyCF_ONLY_AST (ast itself is not imported: it costs more than a request)


# -- the solution's process (untrusted) ----------------------------------------------------

def serve_solution(source, entry_point, calls_fd, answers_fd):
    """In the forked child: run the solution and answer calls until the harness closes the pipe; never returns."""
    status = 0
    try:
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        low, high = sorted((calls_fd, answers_fd))
        os.closerange(3, low)
        os.closerange(low + 1, high)
        os.closerange(high + 1, 1 << 16)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        try:
            code = compile(source, "solution.py", "exec")
        except (SyntaxError, ValueError) as exc:
            write_frame(answers_fd, dumps(["format", "solution does not compile: " + describe(exc)]))
            return
        namespace = {"__name__": "solution", "__builtins__": __builtins__}
        try:
            exec(code, namespace)
        except SystemExit as exc:
            status = exc.code if type(exc.code) is int else (0 if exc.code is None else 1)
            return
        except MemoryError:
            write_frame(answers_fd, dumps(["oom", "MemoryError while loading the solution"]))
            return
        except BaseException as exc:
            write_frame(answers_fd, dumps(["crash", "exception while loading the solution: " + describe(exc)]))
            return
        if not callable(namespace.get(entry_point)):
            write_frame(answers_fd, dumps(["format", "solution defines no function " + entry_point]))
            return
        first = read_frame(calls_fd)  # the prefetched calls, sent while the solution loaded
        if first is None:
            return
        message, batch = decode(first), True
        while True:
            answers = []
            for args, kwargs in (message[1] if batch else [message]):
                try:
                    answer = ["r", encode(namespace[entry_point](*args, **kwargs))]
                except SystemExit as exc:
                    status = exc.code if type(exc.code) is int else (0 if exc.code is None else 1)
                    return
                except BaseException as exc:
                    answer = ["e", type(exc).__name__, describe(exc)]
                answers.append(answer)
            try:
                payload = dumps(["ready", answers] if batch else answers[0])
            except (ValueError, TypeError, RecursionError) as exc:  # e.g. an int of more than 4,300 digits
                error = ["e", type(exc).__name__, "the return value cannot be sent: " + str(exc)[:200]]
                payload = dumps(["ready", [error] * len(answers)] if batch else error)
            write_frame(answers_fd, payload)
            call = read_frame(calls_fd)
            if call is None:
                return
            message, batch = decode(call), False
    except BaseException:
        status = 1
    finally:
        os._exit(status & 0xFF)


# -- the harness (trusted) -----------------------------------------------------------------

class SolutionError(Exception):
    """The solution raised (its exception's type name and where), or its return value was not plain data."""


class SolutionGone(Exception):
    """The solution's process ended, or broke the protocol, while the tests waited for it."""


class RemoteFunction:
    """The solution's entry point as the tests see it: a call sends plain data and waits for plain data.

    `prefetch` sends, as the first message, the calls with literal arguments that the tests'
    source makes (`literal_calls`), while the solution still loads; the solution answers them
    with its "ready" (one wake-up of each process, not two per assert: on a loaded host each
    wake-up costs milliseconds). The first call with the same encoded arguments is answered
    from that reply; the others cross one by one.
    """

    def __init__(self, calls_fd, answers_fd):
        self.calls_fd, self.answers_fd = calls_fd, answers_fd
        self.prefetched = {}

    def prefetch(self, calls):
        """Send the first message: the literal calls that fit in an empty pipe (the write cannot block,
        even if the solution never reads it); returns those sent."""
        sent, size = [], 0
        for key, call in calls:
            size += len(key) + 1
            if size > PREFETCH_BYTES:
                break
            sent.append((key, call))
        try:
            write_frame(self.calls_fd, dumps(["batch", [call for _, call in sent]]))
        except OSError:  # the solution's process has already ended: its last message, or none, tells why
            return []
        return sent

    def accept(self, sent, answers):
        """The solution's answers to the prefetched calls, in order."""
        if type(answers) is not list or len(answers) != len(sent):
            raise SolutionGone("the solution's process broke the protocol")
        self.prefetched = {key: answer for (key, _), answer in zip(sent, answers)}

    def send(self, payload):
        try:
            write_frame(self.calls_fd, payload)
        except OSError as exc:
            raise SolutionGone("cannot send a call: " + str(exc)) from None

    def __call__(self, *args, **kwargs):
        call = [encode(list(args)), encode(kwargs)]
        answer = self.prefetched.pop(dumps(call), None)
        if answer is None:
            self.send(dumps(call))
            answer = receive(self.answers_fd)
        if type(answer) is list and len(answer) == 2 and answer[0] == "r":
            return answer[1]
        if type(answer) is list and len(answer) == 3 and answer[0] == "e" and type(answer[1]) is str and type(answer[2]) is str:
            if answer[1] == "MemoryError":
                raise MemoryError("in the solution: " + answer[2][:500])
            raise SolutionError(answer[2][:600])
        raise SolutionGone("the solution's process sent an answer that is not one: " + repr(answer)[:100])

def receive(answers_fd):
    """The next message of the solution's process, as plain data (a list)."""
    try:
        frame = read_frame(answers_fd)
    except ValueError as exc:
        raise SolutionGone(str(exc)) from None
    except OSError as exc:
        raise SolutionGone("cannot read its answer: " + str(exc)) from None
    if frame is None:
        raise SolutionGone("")
    try:
        message = decode(frame)
    except (ValueError, TypeError, RecursionError) as exc:
        raise SolutionGone("the solution's process sent what is not plain data: " + str(exc)[:200]) from None
    if type(message) is not list or not message:
        raise SolutionGone("the solution's process broke the protocol")
    return message


def main():
    import ctypes

    if ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        os.write(2, b"harness: cannot make itself non-dumpable\n")
        os._exit(3)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # no KeyboardInterrupt can be sent into the tests
    write, exit_now = os.write, os._exit
    header = read_exact(0, HEADER_BYTES)
    public = json.loads(read_exact(0, int(header)).decode())
    entry_point = public["entry_point"]
    tests = {"__name__": "tests"}
    exec(compile(public["prompt"], "prompt.py", "exec"), tests)  # trusted: the dataset's text
    calls_r, calls_w = os.pipe()
    answers_r, answers_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(calls_w)
        os.close(answers_r)
        serve_solution(public["solution"], entry_point, calls_r, answers_w)
    os.close(calls_r)
    os.close(answers_w)
    del public
    nonce, test = b"".join(iter(lambda: os.read(0, 1 << 16), b"")).decode().split("\n", 1)

    def finish(status, detail=""):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
        if detail:
            write(2, detail[-2000:].encode(errors="replace") + b"\n")
        write(1, (nonce + " " + status + "\n").encode())
        exit_now(0 if status == "ok" else 1)

    def solution_gone(why):
        try:
            os.kill(pid, signal.SIGKILL)  # a zombie keeps the status it exited with
        except OSError:
            pass
        status = os.waitpid(pid, 0)[1]
        if why:
            finish("crash", why)
        if os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0:
            finish("wrong", "the solution's process exited with status 0 before the tests finished")
        ended = "signal " + str(os.WTERMSIG(status)) if os.WIFSIGNALED(status) else "status " + str(os.WEXITSTATUS(status))
        finish("crash", "the solution's process ended (" + ended + ") before the tests finished")

    stage = "loading the solution"
    try:
        tree = compile(test, "tests.py", "exec", _ONLY_AST)
        candidate = RemoteFunction(calls_w, answers_r)
        sent = candidate.prefetch(literal_calls(tree, ("candidate", entry_point)))
        test_code = compile(tree, "tests.py", "exec")
        loaded = receive(answers_r)
        if len(loaded) == 2 and loaded[0] in ("format", "crash", "oom") and type(loaded[1]) is str:
            finish(loaded[0], loaded[1])
        if len(loaded) != 2 or loaded[0] != "ready":
            finish("crash", "the solution's process broke the protocol")
        stage = "running the tests"
        candidate.accept(sent, loaded[1])
        tests[entry_point] = candidate  # a test that calls the entry point by name (HumanEval/33) calls it too
        exec(test_code, tests)
        tests["check"](candidate)
    except AssertionError as exc:
        finish("wrong", describe(exc))
    except SolutionGone as exc:
        solution_gone(str(exc))
    except MemoryError as exc:
        finish("oom", "MemoryError while " + stage + ": " + str(exc)[:300])
    except SolutionError as exc:
        finish("crash", "the solution raised while " + stage + ": " + str(exc))
    except BaseException as exc:
        finish("crash", "exception while " + stage + ": " + describe(exc))
    finish("ok")


if __name__ == "__main__":  # as `python3 -c` runs it
    main()
