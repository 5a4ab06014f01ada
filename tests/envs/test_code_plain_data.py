"""The plain-data encoding and framing between the code harness and the solution's process.

No sandbox: rlpipe/envs/code_wire.py is imported as a module. What crosses must come back
with the exact built-in types (bool is not int, 1.0 is not 1, a tuple is not a list), and
anything else, from either side, is refused.
"""

from __future__ import annotations

import collections
import math
import os

import pytest

from rlpipe.envs.code_wire import MAX_FRAME_BYTES, decode, dumps, encode, literal_calls, read_frame, write_frame


def roundtrip(value):
    return decode(dumps(encode(value)))


def shape(value):
    """The value with every element replaced by (its exact type, ...): equality of shapes is type-exact."""
    if isinstance(value, (list, tuple, set, frozenset)):
        items = sorted((shape(item) for item in value), key=repr) if isinstance(value, (set, frozenset)) else [
            shape(item) for item in value]
        return (type(value).__name__, tuple(items))
    if isinstance(value, dict):
        return ("dict", tuple((shape(key), shape(item)) for key, item in value.items()))
    return (type(value).__name__, repr(value))


@pytest.mark.parametrize("value", [
    None, True, False, 0, 1, -7, 2**80, 1.0, 1.5, -0.0, 1e-300, float("inf"), "", "a\nb\u00e9\x00",
    [1, 1.0, True, "1"], (0, 1), (), [(1, 2), [3, (4,)]], {"a": 1, "b": [1.0]}, {(1, 2): "t", 3: None, True: 0.5},
    {1, 2, 3}, frozenset({"x"}), b"\x00\xff", 1 + 2j, [[[]]],
])
def test_plain_values_come_back_with_their_exact_types(value):
    back = roundtrip(value)
    assert shape(back) == shape(value)


def test_nan_stays_nan_and_equal_to_nothing():
    back = roundtrip([float("nan")])
    assert type(back[0]) is float and math.isnan(back[0]) and back != [float("nan")]


def test_bool_int_and_float_stay_apart_as_pythons_own_comparisons_need():
    assert [type(x) for x in roundtrip([True, 1, 1.0])] == [bool, int, float]
    assert roundtrip(1.5) == 1.5 and abs(roundtrip(0.1 + 0.2) - 0.3) < 1e-6  # repr round-trips a float exactly
    assert roundtrip(0.1 + 0.2) == 0.30000000000000004


@pytest.mark.parametrize("value", [
    type("Int", (int,), {"__eq__": lambda self, other: True, "__hash__": int.__hash__})(1),
    type("Float", (float,), {})(1.0),
    type("Str", (str,), {})("x"),
    object(), len, (x for x in ()), range(3), [object()],
])
def test_subclasses_of_scalars_and_other_objects_are_not_plain_data(value):
    with pytest.raises(TypeError, match="not plain data"):
        encode(value)


def test_container_subclasses_cross_as_their_base_type_contents():
    always_equal = type("Eq", (list,), {"__eq__": lambda self, other: True})([1])
    point = collections.namedtuple("Point", "x y")(1, 2)
    counted = collections.Counter("aab")
    assert shape(roundtrip([always_equal, point, counted])) == shape([[1], (1, 2), {"a": 2, "b": 1}])
    assert roundtrip(always_equal) != [2]  # the contents, not the subclass's __eq__


@pytest.mark.parametrize("data", [
    b'{"eq": true}', b'{"t": [1], "d": []}', b'{"d": [[[1], 2]]}', b'{"s": [[1]]}', b'{"d": [[1]]}',
    b'{"t": 5}', b'{"c": ["1", 2]}', b"[" * 100_000 + b"]" * 100_000, b"\xff",
])
def test_anything_but_encoded_plain_data_is_refused(data):
    with pytest.raises((ValueError, TypeError, RecursionError)):
        decode(data)


def test_frames_carry_bytes_exactly_and_refuse_oversized_announcements():
    read_fd, write_fd = os.pipe()
    try:
        write_frame(write_fd, b"")
        write_frame(write_fd, b"x" * 1000)
        os.write(write_fd, (MAX_FRAME_BYTES + 1).to_bytes(4, "big"))
        assert read_frame(read_fd) == b"" and read_frame(read_fd) == b"x" * 1000
        with pytest.raises(ValueError, match="frame of"):
            read_frame(read_fd)
        os.close(write_fd)
        write_fd = -1
        assert read_frame(read_fd) is None
    finally:
        os.close(read_fd)
        if write_fd >= 0:
            os.close(write_fd)


def test_literal_calls_are_the_distinct_literal_calls_of_the_tests_in_source_order():
    source = (
        "def check(candidate):\n"
        "    assert candidate([1.0, -2], 0.5) == True\n"
        "    assert f(3) == candidate(x)\n"  # computed argument: not prefetched; f is not the candidate
        "    assert candidate('a', key={'k': (1,)}) == 1\n"
        "    assert candidate([1.0, -2], 0.5)\n"  # the same call again: prefetched once
        "    assert name(-1.5) == candidate(*rest)\n"
    )
    tree = compile(source, "tests.py", "exec", 0x400)
    calls = [decode(dumps(call)) for _, call in literal_calls(tree, ("candidate", "name"))]
    assert calls == [[[[1.0, -2], 0.5], {}], [["a"], {"key": {"k": (1,)}}], [[-1.5], {}]]
    assert all(key == dumps(call) for key, call in literal_calls(tree, ("candidate",)))
