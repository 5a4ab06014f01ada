"""What crosses between the code harness and the solution's process: plain data, framed.

Sent into the sandbox above code_harness.py's text (envs/code.py joins them), and imported
by it and by the tests when rlpipe imports it. `encode` turns a value into JSON-ready data
with the exact built-in type kept (tuple, dict, set, frozenset, bytes, complex as tagged
objects), refusing subclasses of scalars and anything that is not plain data (container
subclasses cross as their base type's contents); `decode` builds fresh built-in objects
from such bytes and refuses anything else. Frames are a 4-byte length and the bytes,
capped at MAX_FRAME_BYTES. `literal_calls` finds the calls with literal arguments in the
tests' AST (without importing `ast`, which costs more than a request). It runs nothing.
"""

import json
import os
import struct

HEADER_BYTES = 16  # the harness's stdin starts with the public part's length, in decimal, padded to 16 bytes
MAX_FRAME_BYTES = 16 << 20  # a reply larger than this is a crash, not a memory bomb for the harness
_FRAME = struct.Struct(">I")


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
