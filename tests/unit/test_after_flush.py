"""``after_flush``: bookkeeping runs once the corked writes are out, never before them."""

from __future__ import annotations

import os

from supervisor.processes.direct_write import DirectWriter, after_flush, cork, uncork


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
