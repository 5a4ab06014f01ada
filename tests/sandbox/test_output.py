"""The output pump on a plain child process: caps, truncation flags, stdin, deadline."""

from __future__ import annotations

import subprocess
import sys
import time

from rlpipe.sandbox.output import CappedBuffer, pump


def _run(code: str, stdin: bytes = b"", cap_bytes: int = 100, timeout_s: float = 10.0):
    process = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE)
    try:
        captured = pump(process.stdin, process.stdout.fileno(), process.stderr.fileno(), stdin, cap_bytes,
                        time.monotonic() + timeout_s)
    finally:
        process.stdout.close()
        process.stderr.close()
        process.kill()
        process.wait()
    return captured


def test_capped_buffer_keeps_the_head_and_counts_the_rest():
    buffer = CappedBuffer(cap_bytes=5, data=bytearray())
    buffer.add(b"abc")
    buffer.add(b"defgh")  # 3 + 5 = 8 bytes: keeps 5, drops 3
    assert bytes(buffer.data) == b"abcde" and buffer.dropped_bytes == 3 and buffer.truncated


def test_each_stream_is_cut_at_the_cap_and_flagged():
    captured = _run("import sys; sys.stdout.write('o' * 5000); sys.stderr.write('e' * 50)")
    assert captured.stdout.text() == "o" * 100 and captured.stdout.truncated
    assert captured.stderr.text() == "e" * 50 and not captured.stderr.truncated


def test_stdin_larger_than_a_pipe_buffer_is_fed_whole():
    captured = _run("import sys; print(len(sys.stdin.buffer.read()))", stdin=b"x" * 1_000_000)
    assert captured.stdout.text() == "1000000\n"


def test_the_deadline_stops_the_pump():
    started = time.monotonic()
    captured = _run("import time; time.sleep(30)", timeout_s=0.3)
    assert captured.deadline_passed and time.monotonic() - started < 5
