"""Plain non-blocking sockets for the egress proxy's connection path (``host.egress``).

# Strategy: trio's socket streams yield to the scheduler after every operation: a dozen
# scheduler passes per proxied connection, host CPU on every egress call. Here each operation
# is tried at once and waits only when the kernel says so (``wait_readable``/``wait_writable``);
# :func:`pump` moves a tunnel's bytes socket -> pipe -> socket with ``splice(2)``, so they never
# enter Python and one wake-up moves whatever the socket holds (up to the pipe's 64 KiB).
"""

from __future__ import annotations

import errno
import os
import select
import socket as stdsocket
from collections.abc import Callable

import trio


def close(sock: stdsocket.socket) -> None:
    """Close ``sock``, waking (with ``ClosedResourceError``) a task that waits on it (nothing
    when its descriptor was handed on: ``detach``); in any thread."""
    if sock.fileno() < 0:
        return
    try:
        trio.lowlevel.notify_closing(sock)
    except RuntimeError:  # not in the trio thread (the relay's): no task of trio waits on it
        pass
    sock.close()


class Closing:
    """Closes its socket at the end of a ``with`` (telling trio first)."""

    def __init__(self, sock: stdsocket.socket) -> None:
        self.sock = sock

    def __enter__(self) -> stdsocket.socket:
        return self.sock

    def __exit__(self, *exc: object) -> None:
        close(self.sock)


async def recv(sock: stdsocket.socket, n: int) -> bytes:
    """Up to ``n`` bytes (``b""``: the peer is done), waiting only when none is there."""
    while True:
        try:
            return sock.recv(n)
        except BlockingIOError:
            await trio.lowlevel.wait_readable(sock)


async def send_all(sock: stdsocket.socket, data: bytes, flags: int = 0) -> None:
    """Send all of ``data``, waiting only while the socket's buffer is full."""
    view = memoryview(data)
    while view:
        try:
            view = view[sock.send(view, flags) :]
        except BlockingIOError:
            await trio.lowlevel.wait_writable(sock)


def start_connect(address: str, port: int) -> tuple[stdsocket.socket, bool]:
    """A TCP connection to an address literal (the checked one: no name, so no resolution and
    no happy-eyeballs race to set up), started; True when it is already done (a loopback
    handshake is over when ``connect`` returns): :func:`finish_connect` then waits for
    nothing.

    Raises:
        OSError: Refused, unreachable (at once).
    """
    family = stdsocket.AF_INET6 if ":" in address else stdsocket.AF_INET
    sock = stdsocket.socket(family, stdsocket.SOCK_STREAM)
    try:
        sock.setblocking(False)
        err = sock.connect_ex((address, port))
        if err and err != errno.EINPROGRESS:
            raise OSError(err, os.strerror(err))
    except BaseException:
        close(sock)
        raise
    return sock, not err or _ready(sock)


async def finish_connect(sock: stdsocket.socket, done: bool) -> None:
    """Wait (unless ``done``) until ``sock``'s connection is made; closes it when it failed.

    Raises:
        OSError: Refused, unreachable.
    """
    try:
        if not done:
            await trio.lowlevel.wait_writable(sock)
        connected(sock)
    except BaseException:
        close(sock)
        raise


def connected(sock: stdsocket.socket) -> None:
    """Check a connect that is done (``TCP_NODELAY`` set when it was made).

    Raises:
        OSError: It failed (``sock`` is left open).
    """
    err = sock.getsockopt(stdsocket.SOL_SOCKET, stdsocket.SO_ERROR)
    if err:
        raise OSError(err, os.strerror(err))
    sock.setsockopt(stdsocket.IPPROTO_TCP, stdsocket.TCP_NODELAY, 1)


def _ready(sock: stdsocket.socket) -> bool:
    """Whether a connecting socket is done (connected or failed) now, without a wait."""
    poller = select.poll()
    poller.register(sock, select.POLLOUT)
    return bool(poller.poll(0))


YIELD_BYTES = 1 << 20
"""A tunnel moving this much without waiting lets the host's other tasks run."""
SPLICE_FLAGS = getattr(os, "SPLICE_F_MOVE", 0) | getattr(os, "SPLICE_F_NONBLOCK", 0)
NO_SPLICE = (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.EPERM)


async def pump(
    src: stdsocket.socket,
    dst: stdsocket.socket,
    chunk: int,
    slot: int,
    moved: Callable[[int, int], None],
    prefix: bytes = b"",
) -> bool:
    """Move bytes ``src`` -> a pipe -> ``dst`` with ``splice(2)`` until ``src`` ends; each
    delivered count goes to ``moved(slot, n)``. ``prefix`` (not counted) goes out just before
    the first bytes, or alone when ``src`` ends without any. False (nothing moved) when
    splicing these sockets is not possible here: the caller copies through Python instead.

    Raises:
        OSError: Either socket failed (reset, broken pipe).
    """
    if not hasattr(os, "splice"):
        return False
    try:
        r, w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:  # out of descriptors: this tunnel copies through Python
        return False
    try:
        first, unwaited = True, 0
        while True:
            if unwaited > YIELD_BYTES:  # a stream that never makes us wait must not hog the loop
                await trio.lowlevel.checkpoint()
                unwaited = 0
            try:
                n = os.splice(src.fileno(), w, chunk, flags=SPLICE_FLAGS)
            except BlockingIOError:
                await trio.lowlevel.wait_readable(src)
                unwaited = 0
                continue
            except OSError as exc:
                if first and exc.errno in NO_SPLICE:
                    return False
                raise
            first = False
            if prefix:  # coalesced with what follows (MSG_MORE): one wake-up of the reader
                await send_all(dst, prefix, stdsocket.MSG_MORE if n else 0)
                prefix = b""
            if n == 0:
                return True
            while n:
                try:
                    out = os.splice(r, dst.fileno(), n, flags=SPLICE_FLAGS)
                except BlockingIOError:
                    await trio.lowlevel.wait_writable(dst)
                    unwaited = 0
                    continue
                n -= out
                unwaited += out
                moved(slot, out)
    finally:
        os.close(r)
        os.close(w)


async def splice_both(
    client: stdsocket.socket,
    upstream: stdsocket.socket,
    counts: list[int],
    answer: bytes,
    chunk: int,
    idle_timeout_s: float,
) -> None:
    """Copy both ways in trio tasks (where the relay thread is not available) until both sides
    are done (half-closes passed on) or nothing moved for ``idle_timeout_s``; ``answer`` (not
    counted) goes to the client before the first bytes from upstream."""
    # The deadline moves at most every `step` (moving it is trio bookkeeping): a tunnel
    # closes after `idle_timeout_s` without a byte, and within `step` after that.
    step = min(1.0, idle_timeout_s / 10)
    idle = idle_timeout_s + step
    scope: trio.CancelScope  # the nursery's (below): no scope of its own per tunnel

    def moved(slot: int, n: int) -> None:
        counts[slot] += n
        now = trio.current_time()
        if now + idle - scope.deadline > step:
            scope.deadline = now + idle

    async def copy(
        src: stdsocket.socket, dst: stdsocket.socket, slot: int, prefix: bytes = b""
    ) -> None:
        try:
            if not await pump(src, dst, chunk, slot, moved, prefix):
                while data := await recv(src, chunk):  # no splice here
                    await send_all(dst, prefix + data)
                    moved(slot, len(data))
                    prefix = b""
                await send_all(dst, prefix)
            dst.shutdown(stdsocket.SHUT_WR)
        except OSError:
            scope.cancel()

    async with trio.open_nursery() as nursery:
        scope = nursery.cancel_scope
        scope.deadline = trio.current_time() + idle
        nursery.start_soon(copy, client, upstream, 1)
        await copy(upstream, client, 0, answer)
