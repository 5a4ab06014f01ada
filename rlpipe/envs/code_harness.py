"""The code env's harness: runs in a sandbox, tests a solution that lives in another process.

Its text is run as `python3 -I -S -c TEXT` by `Sandbox.exec_python` (stdlib only: rlpipe is
not installed in a sandbox); rlpipe and the tests import it for `encode`/`decode` and the
framing. envs/code.py builds its stdin and reads its verdict.

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
import struct
import sys

HEADER_BYTES = 16  # the stdin starts with the public part's length, in decimal, padded to 16 bytes
PREFETCH_BYTES = 60_000  # the first message fits in an empty pipe (64 KiB), so writing it never blocks
MAX_FRAME_BYTES = 16 << 20  # a reply larger than this is a crash, not a memory bomb for the harness
_PR_SET_DUMPABLE = 4
_FRAME = struct.Struct(">I")
_ONLY_AST = 0x400  # ast.PyCF_ONLY_AST (ast itself is not imported: it costs more than a request)


# -- plain data (both sides) ---------------------------------------------------------------

def encode(value):
    """`value` as JSON-ready plain data with exact types kept (see the module docstring)."""
    kind = type(value)
    if value is None or kind is bool or kind is int or kind is float or kind is str:
        return value
    if isinstance(value, list):
        return [encode(item) for item in list.__iter__(value)]
    if isinstance(value, tuple):
        return {"t": [encode(item) for item in tuple.__iter__(value)]}
    if isinstance(value, dict):
        return {"d": [[encode(key), encode(item)] for key, item in dict.items(value)]}
    if isinstance(value, frozenset):
        return {"z": [encode(item) for item in frozenset.__iter__(value)]}
    if isinstance(value, set):
        return {"s": [encode(item) for item in set.__iter__(value)]}
    if kind is bytes:
        return {"b": value.hex()}
    if kind is complex:
        return {"c": [value.real, value.imag]}
    raise TypeError("not plain data: a value of type " + kind.__name__)


def _tagged(pairs):
    """A JSON object of `encode`'s output back to its type; anything else is refused."""
    if len(pairs) != 1:
        raise ValueError("a tagged value has exactly one key")
    tag, body = pairs[0]
    if tag == "b" and type(body) is str:
        return bytes.fromhex(body)
    if type(body) is not list:
        raise ValueError("a tagged value holds a list")
    if tag == "t":
        return tuple(body)
    if tag == "d":
        if any(type(pair) is not list or len(pair) != 2 for pair in body):
            raise ValueError("a dict is a list of [key, value] pairs")
        return {key: item for key, item in body}
    if tag == "s":
        return set(body)
    if tag == "z":
        return frozenset(body)
    if tag == "c" and len(body) == 2 and all(type(part) in (int, float) for part in body):
        return complex(body[0], body[1])
    raise ValueError("unknown tag " + repr(tag)[:20])


def dumps(message):
    return json.dumps(message, separators=(",", ":")).encode()


def decode(data):
    """Plain data from `dumps(...)` bytes: built-in types only, made here (ValueError/TypeError if malformed)."""
    return json.loads(data.decode("utf-8"), object_pairs_hook=_tagged)


# -- framing -------------------------------------------------------------------------------

def write_frame(fd, payload):
    view = memoryview(_FRAME.pack(len(payload)) + payload)
    while view:
        view = view[os.write(fd, view):]


def read_exact(fd, size):
    """Exactly `size` bytes, or None at end of input (never more than asked: the rest stays in the pipe)."""
    parts, remaining = [], size
    while remaining:
        chunk = os.read(fd, min(remaining, 1 << 20))
        if not chunk:
            return None
        parts.append(chunk)
        remaining -= len(chunk)
    return b"".join(parts)


def read_frame(fd, limit=MAX_FRAME_BYTES):
    """One frame's bytes; None at end of input; ValueError if it announces more than `limit`."""
    size = read_exact(fd, _FRAME.size)
    if size is None:
        return None
    length = _FRAME.unpack(size)[0]
    if length > limit:
        raise ValueError("a frame of " + str(length) + " bytes (the limit is " + str(limit) + ")")
    return read_exact(fd, length)


def describe(exc):
    where, trace = [], exc.__traceback__
    while trace is not None:
        where.append(trace.tb_frame.f_code.co_filename + ":" + str(trace.tb_lineno))
        trace = trace.tb_next
    return type(exc).__name__ + ": " + str(exc)[:500] + " (at " + " <- ".join(reversed(where[-3:])) + ")"


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


def literal_calls(tree, names):
    """[(encoded call, call)] for each distinct call `name(literal, ...)` in the tests' AST, in source order."""
    import _ast

    found = {}
    for node in sorted((node for node in walk(tree) if isinstance(node, _ast.Call)),
                       key=lambda node: (node.lineno, node.col_offset)):
        if not isinstance(node.func, _ast.Name) or node.func.id not in names:
            continue
        try:
            if any(keyword.arg is None for keyword in node.keywords):
                continue
            call = [encode([literal(arg) for arg in node.args]),
                    encode({keyword.arg: literal(keyword.value) for keyword in node.keywords})]
        except (ValueError, TypeError):
            continue
        found.setdefault(dumps(call), call)
    return list(found.items())


def walk(node):
    import _ast

    pending = [node]
    while pending:
        node = pending.pop()
        yield node
        for name in node._fields:
            value = getattr(node, name, None)
            if isinstance(value, _ast.AST):
                pending.append(value)
            elif isinstance(value, list):
                pending.extend(item for item in value if isinstance(item, _ast.AST))


def literal(node):
    """The value of a literal expression node (what ast.literal_eval accepts, less complex sums); ValueError if not one."""
    import _ast

    if isinstance(node, _ast.Constant) and type(node.value) in (int, float, str, bool, bytes, type(None), complex):
        return node.value
    if isinstance(node, _ast.UnaryOp) and isinstance(node.op, (_ast.USub, _ast.UAdd)):
        value = literal(node.operand)
        if type(value) in (int, float, complex):
            return -value if isinstance(node.op, _ast.USub) else +value
    if isinstance(node, (_ast.List, _ast.Tuple, _ast.Set)):
        items = [literal(item) for item in node.elts]
        return list(items) if isinstance(node, _ast.List) else tuple(items) if isinstance(node, _ast.Tuple) else set(items)
    if isinstance(node, _ast.Dict) and None not in node.keys:
        return {literal(key): literal(value) for key, value in zip(node.keys, node.values)}
    raise ValueError("not a literal")


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
