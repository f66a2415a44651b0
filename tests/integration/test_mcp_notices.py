"""The MCP faces' own notifications to a client that does not read (``mcp_face/notices.py``).

On a real pipe: in order while the client keeps up; past the bound, one held per key (a later
one replacing it, in the place of the first), written once the client has read the backlog; a
call's held progress dropped when its answer goes out. The HTTP streams' queue the same way.
"""

from __future__ import annotations

import os

import trio
import trio.testing

from supervisor.mcp_face.notices import NoticeQueue, Notices
from supervisor.processes.direct_write import DirectWriter


async def _read_all(fd: int, until: bytes) -> bytes:
    """Read ``fd`` (non-blocking) until ``until`` ends what was read."""
    got = bytearray()
    while not got.endswith(until):
        try:
            chunk = os.read(fd, 1 << 16)
        except BlockingIOError:
            await trio.lowlevel.wait_readable(fd)
            continue
        assert chunk, "EOF before the end"
        got += chunk
    return bytes(got)


async def test_in_order_while_read_then_held_by_key_until_read():
    r, w = os.pipe()
    os.set_blocking(r, False)
    os.set_blocking(w, False)
    try:
        out = DirectWriter(w)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(out.run)
            notices = Notices(out, nursery, limit=100_000)
            for i in range(3):  # nothing unread: each goes out at once, none coalesced
                notices.send("tools", b"tools %d\n" % i)
            assert notices.held == 0
            assert await _read_all(r, b"tools 2\n") == b"tools 0\ntools 1\ntools 2\n"

            out.write(b"a" * 300_000 + b"\n")  # an answer the client does not read yet
            assert out.pending_bytes > notices.limit
            for i in range(1000):
                notices.send(("updated", f"u{i % 3}"), b"updated u%d %d\n" % (i % 3, i))
                notices.send(("progress", 7), b"progress 7 %d\n" % i)
            assert notices.held == 4 and notices.coalesced == 2000 - 4
            notices.drop(("progress", 7))  # the call's answer goes out: no progress after it
            out.write(b"answer 7\n")
            got = await _read_all(r, b"updated u2 998\n")
            tail = b"answer 7\nupdated u0 999\nupdated u1 997\nupdated u2 998\n"
            assert got == b"a" * 300_000 + b"\n" + tail
            await trio.testing.wait_all_tasks_blocked()
            assert notices.held == 0
            notices.send("tools", b"tools 3\n")  # read again: straight through
            assert await _read_all(r, b"tools 3\n") == b"tools 3\n"
            nursery.cancel_scope.cancel()
    finally:
        os.close(r)
        os.close(w)


async def test_queue_in_order_under_the_bound_then_one_per_key():
    queue = NoticeQueue(limit=50)
    for i in range(5):
        queue.put("progress", b"p%d" % i)  # 10 bytes: under the bound, every one kept
    assert [await queue.get() for _ in range(5)] == [b"p0", b"p1", b"p2", b"p3", b"p4"]
    for i in range(100):  # nobody reads: 50 bytes kept in order, then one per key
        queue.put(("updated", i % 2), b"u%d-%03d" % (i % 2, i))
    queue.put("answer", b"answer")
    queue.close()
    got = []
    while (data := await queue.get()) is not None:
        got.append(data)
    kept = [b"u%d-%03d" % (i % 2, i) for i in range(9)]  # 6 bytes each: 54 > 50 after nine
    assert got == [*kept, b"u1-099", b"u0-098", b"answer"], got
    assert queue.coalesced == 100 - 9 - 2
