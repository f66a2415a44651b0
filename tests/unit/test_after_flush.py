"""``after_flush``: bookkeeping runs once the corked writes are out, never before them."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from supervisor.processes.direct_write import (
    DirectWriter,
    after_flush,
    cork,
    one_message,
    uncork,
)


def test_corked_work_runs_after_the_gathered_write_and_once() -> None:
    r, w = os.pipe()
    os.set_blocking(w, False)
    try:
        writer = DirectWriter(w)
        seen: list[bytes] = []
        os.set_blocking(r, False)

        def bookkeeping() -> None:
            try:
                seen.append(os.read(r, 100))  # what the peer could read by then
            except BlockingIOError:
                seen.append(b"")

        cork()
        cork()  # nested: only the outermost uncork writes and runs the work
        writer.write(b"answer\n")
        after_flush(bookkeeping)
        uncork()
        assert seen == []
        uncork()
        assert seen == [b"answer\n"]
        ran = seen.copy()
        cork()
        uncork()
        assert seen == ran  # ran once, not again at the next uncork
    finally:
        os.close(r)
        os.close(w)


def test_uncorked_work_runs_at_once() -> None:
    seen: list[int] = []
    after_flush(lambda: seen.append(1))
    assert seen == [1]


def _readable(r: int) -> bytes:
    try:
        return os.read(r, 1000)
    except BlockingIOError:
        return b""


@pytest.fixture
def pipe() -> Iterator[tuple[int, int]]:
    """A pipe, both ends non-blocking: (read end, write end)."""
    r, w = os.pipe()
    os.set_blocking(r, False)
    os.set_blocking(w, False)
    yield r, w
    os.close(r)
    os.close(w)


def test_a_chunk_of_one_message_writes_at_once_and_its_bookkeeping_still_waits(pipe) -> None:
    r, w = pipe
    writer = DirectWriter(w)
    done: list[bytes] = []
    cork()
    one_message()
    writer.write(b"answer\n")
    assert _readable(r) == b"answer\n"  # out before the call stack unwinds to uncork
    after_flush(lambda: done.append(b"kept"))
    assert done == []  # the bookkeeping still waits for the uncork
    cork()  # a nested cork (a batch inside) gathers again
    writer.write(b"one\n")
    writer.write(b"two\n")
    uncork()
    assert _readable(r) == b""
    uncork()
    assert _readable(r) == b"one\ntwo\n" and done == [b"kept"]
    cork()  # the next chunk is not one message unless it says so
    writer.write(b"later\n")
    assert _readable(r) == b""
    uncork()
    assert _readable(r) == b"later\n"


def test_one_message_is_ignored_once_something_was_gathered(pipe) -> None:
    r, w = pipe
    writer = DirectWriter(w)
    cork()
    writer.write(b"first\n")
    one_message()  # too late: "second" must not overtake "first"
    writer.write(b"second\n")
    assert _readable(r) == b""
    uncork()
    assert _readable(r) == b"first\nsecond\n"
