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
