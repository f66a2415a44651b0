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
    bytearray in the frames of the error's traceback (which the reader keeps while it answers)."""
    sizes = [sys.getsizeof(splitter._buf)]
    tb = exc.__traceback__
    while tb is not None:
        sizes += [sys.getsizeof(v) for v in tb.tb_frame.f_locals.values() if type(v) is bytearray]
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
