import random
import sys

import pytest

from supervisor.protocols.errors import LineTooLong
from supervisor.protocols.framing import LengthPrefixSplitter, LineSplitter, length_prefixed


def test_lines_fast_and_slow_paths():
    s = LineSplitter(100)
    assert s.feed(b"a\nb\n") == [b"a", b"b"]
    assert s.feed(b"c") == []
    assert s.feed(b"d\ne") == [b"cd"]
    assert s.pending == 1
    assert s.take_pending() == b"e"
    assert s.feed(b"\n") == [b""]


def test_line_limit_on_growing_line():
    s = LineSplitter(10)
    s.feed(b"12345")
    with pytest.raises(LineTooLong):
        s.feed(b"678901")


def test_length_prefix_roundtrip_any_chunking():
    frames = [b"", b"x", b"hello" * 100]
    data = b"".join(length_prefixed(f) for f in frames)
    for step in (1, 3, len(data)):
        s = LengthPrefixSplitter(1000)
        out = []
        for i in range(0, len(data), step):
            out += s.feed(data[i : i + step])
        assert out == frames
        assert s.pending == 0


def test_length_prefix_limit():
    s = LengthPrefixSplitter(10)
    with pytest.raises(LineTooLong):
        s.feed((11).to_bytes(4, "big"))


def _held_bytearrays(exc: BaseException, splitter) -> list[int]:
    """Sizes of the buffers a refused frame leaves reachable: the splitter's own and every
    bytearray (or list of pending parts) in the frames of the error's traceback (which the
    reader keeps while it answers)."""
    sizes = [sum(map(len, splitter._parts))]
    tb = exc.__traceback__
    while tb is not None:
        for v in tb.tb_frame.f_locals.values():
            if type(v) is bytearray:
                sizes.append(sys.getsizeof(v))
            elif type(v) is list and all(type(p) in (bytes, bytearray) for p in v):
                sizes.append(sum(map(len, v)))
        tb = tb.tb_next
    return sizes


@pytest.mark.parametrize("complete", [False, True])
def test_a_refused_line_gives_its_memory_back(complete):
    """Issue 26 item 8: after one refused line the splitter held its whole buffer (up to the
    limit, 16 MiB for a kernel connection) for as long as the connection object lived."""
    limit = 4 << 20
    s = LineSplitter(limit)
    with pytest.raises(LineTooLong) as info:
        if complete:  # a whole over-long line, after a partial one, with the next one begun
            s.feed(b"x")
            s.feed(b"a" * (limit + 10) + b"\nnext")
        else:  # a line still growing past the limit
            for _ in range(limit // 65536 + 2):
                s.feed(b"a" * 65536)
    assert s.pending == 0
    assert max(_held_bytearrays(info.value, s)) < 1024


def test_a_refused_length_prefix_frame_keeps_nothing():
    s = LengthPrefixSplitter(1024)
    with pytest.raises(LineTooLong):
        s.feed(length_prefixed(b"x" * 10) + (1 << 20).to_bytes(4, "big") + b"y" * 60_000)
    assert s.pending == 0


@pytest.mark.parametrize("seed", range(6))
def test_lines_come_out_whole_whatever_the_chunking(seed):
    """The chunks of an unfinished line are kept and joined when its newline arrives: any
    chunking (one byte, small, larger than a part, across several lines, bytearrays the caller
    reuses) gives the lines the stream holds, in order."""
    rng = random.Random(seed)
    lines = [
        bytes([97 + i % 26]) * rng.choice([0, 1, 7, 4095, 4096, 9000, 70_000]) for i in range(40)
    ]
    stream = b"".join(line + b"\n" for line in lines)
    s = LineSplitter(1 << 20)
    out: list[bytes] = []
    reused = bytearray()
    pos = 0
    while pos < len(stream):
        step = rng.choice([1, 3, 100, 4095, 5000, 65536, 200_000])
        chunk = stream[pos : pos + step]
        pos += step
        if rng.random() < 0.3:  # a caller's buffer, overwritten after the call
            reused[:] = chunk
            out += s.feed(reused)
            reused[:] = b"?" * len(reused)
        else:
            out += s.feed(chunk)
    assert out == lines
    assert s.pending == 0


def test_a_trickled_line_is_gathered_not_kept_byte_by_byte():
    """One-byte chunks of an unfinished line go into one buffer (not one object per byte)."""
    s = LineSplitter(1 << 20)
    for _ in range(20_000):
        assert s.feed(b"x") == []
    assert s.pending == 20_000
    assert len(s._parts) == 1
    assert s.feed(b"y\n") == [b"x" * 20_000 + b"y"]
