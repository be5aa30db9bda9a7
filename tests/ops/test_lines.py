"""The request-line buffer (semq.ops.lines), sans-IO: any split of the
input gives the same lines; it never holds more than a line of its limit
and its newline; a byte-at-a-time drip costs time linear in the bytes;
the admin socket's server reads through it (a stream without a newline is
refused after the limit, never buffered beyond it)."""

from __future__ import annotations

import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from semq.ops.lines import LineBuffer, LineTooLong


def _drain(buf: LineBuffer, out: list[bytes]) -> None:
    while (line := buf.next_line()) is not None:
        out.append(line)


@given(st.lists(st.binary(max_size=40), max_size=12), st.lists(st.integers(1, 17), min_size=1, max_size=8))
def test_any_split_gives_the_same_lines_and_never_more_than_the_limit_is_held(
        lines: list[bytes], cuts: list[int]) -> None:
    lines = [x.replace(b"\n", b"") for x in lines]
    data = b"".join(x + b"\n" for x in lines)
    buf = LineBuffer(40)
    out: list[bytes] = []
    pos, i = 0, 0
    while pos < len(data):
        n = min(cuts[i % len(cuts)], buf.room(), len(data) - pos)
        buf.feed(data[pos:pos + n])
        pos += n
        i += 1
        assert buf.buffered <= 41
        _drain(buf, out)
    assert out == lines and buf.buffered == 0


def test_more_than_the_limit_without_a_newline_is_refused_naming_both() -> None:
    buf = LineBuffer(4096)
    buf.feed(b"x" * 4096)
    assert buf.next_line() is None and buf.room() == 1
    with pytest.raises(ValueError, match="2 bytes fed where 1 fit"):
        buf.feed(b"xx")  # the shell's bug, never a larger buffer
    buf.feed(b"x")
    with pytest.raises(LineTooLong, match="4097 bytes without a newline exceed the 4096-byte limit of a line"):
        buf.next_line()


def test_the_limit_is_raised_after_the_first_line() -> None:
    buf = LineBuffer(8)
    buf.feed(b"auth\nnex")
    assert buf.next_line() == b"auth" and buf.next_line() is None
    buf.limit = 100
    buf.feed(b"t" * 50 + b"\n")
    assert buf.next_line() == b"nex" + b"t" * 50


def test_a_drip_costs_time_linear_in_the_bytes() -> None:
    """200,000 bytes one at a time onto 1.8 MiB: each byte is scanned once
    (about 0.3 s); a scan from the start at each byte would look at
    4 * 10^11 bytes (about 12 s at 35 GB/s)."""
    limit = 2 << 20
    buf = LineBuffer(limit)
    buf.feed(b"x" * (limit - 200_000))
    assert buf.next_line() is None
    t0 = time.process_time()
    for _ in range(200_000):
        buf.feed(b"x")
        assert buf.next_line() is None
    assert time.process_time() - t0 < 3.0
