"""The egress proxy's relay thread (``host.egress``): checked, connected tunnels move their bytes
here, off the trio loop, and the proxy's listeners are accepted on here.

# Strategy: one thread per :class:`~supervisor.host.egress.EgressProxy`, its own ``epoll``
# (edge-triggered; each socket registered once, when its tunnel is handed over: ``epoll_ctl``
# is thread-safe and the registration reports a socket that is already readable, so a
# hand-over wakes nobody) and ``splice(2)`` socket -> pipe -> socket both ways. The proxy's
# listeners are in the same ``epoll`` (level-triggered, one accept per event; paused for
# ``ACCEPT_PAUSE_S`` when an accept fails for want of descriptors): each connection goes to its
# :class:`Listener`'s ``take`` in this thread (the proxy's fast path, which ends in
# :meth:`Relay.carry` or hands the connection to the trio loop). The trio loop hands over the
# tunnels it checked and connected itself (:meth:`Relay.add`). A tunnel and both its sockets
# belong to the relay, which closes them when the tunnel is over (both ways ended, an error,
# idle, or cut) and then runs its ``release`` (the open count). What is left to do in the trio
# thread (the sidecar's counts, the audit line: the tunnel's ``finish``) waits in a queue that
# the trio loop empties when it passes anyway (:meth:`Relay.flush`: the next connection it
# serves, ``statistics()``, the stop), or that the relay asks it to empty ``FLUSH_S`` later: no
# wake-up of the trio loop per tunnel, no trio task, cancel scope or scheduler pass per byte
# wake-up. A cut (``forget``, the host's stop) goes to the relay by a command and an
# ``eventfd`` wake; ``forget`` closes a worker's listeners at once (:meth:`Relay.unlisten`,
# under the lock).
"""

from __future__ import annotations

import collections
import logging
import os
import select
import socket as stdsocket
import threading
import time
from collections.abc import Callable

import trio

from supervisor.host.egress_io import NO_SPLICE, SPLICE_FLAGS, YIELD_BYTES

log = logging.getLogger("toolhost.egress")

_READ = select.EPOLLIN | select.EPOLLRDHUP | select.EPOLLET
"""Each socket is watched for reading (edge-triggered); for writing only once a way found it
full (:meth:`Relay._arm`): a writable edge at every ACK would wake the relay for nothing."""
_IN = select.EPOLLIN | select.EPOLLRDHUP | select.EPOLLHUP | select.EPOLLERR
_OUT = select.EPOLLOUT | select.EPOLLHUP | select.EPOLLERR
_OPEN, _EOF, _DONE = 0, 1, 2
_NO_PIPE, _COPY = -1, -2
_STOP_WAIT_S = 5.0
"""How long the stop waits for the relay thread to end."""


def available() -> bool:
    """Whether this platform has what the relay needs (Linux: ``epoll``, ``splice``,
    ``eventfd``)."""
    return all(hasattr(m, n) for m, n in ((select, "epoll"), (os, "splice"), (os, "eventfd")))


class _Way:
    """One direction of a tunnel: ``src`` -> pipe (or a buffer) -> ``dst``."""

    __slots__ = (
        "armed",
        "buf",
        "dst",
        "fin",
        "fout",
        "held",
        "pending",
        "prefix",
        "r",
        "slot",
        "src",
        "state",
        "w",
    )

    def __init__(
        self, src: stdsocket.socket, dst: stdsocket.socket, slot: int, prefix: bytes
    ) -> None:
        self.src, self.dst, self.slot = src, dst, slot
        self.fin, self.fout = src.fileno(), dst.fileno()
        self.r = self.w = _NO_PIPE  # made by the relay thread at the first bytes
        self.held = 0  # bytes in the pipe
        self.buf = b""  # bytes held when splicing is not possible (copy mode)
        self.prefix = prefix  # goes out just before the first bytes (or alone at the end)
        self.pending = b""
        self.state = _OPEN
        self.armed = False  # its destination is watched for writing


class Tunnel:
    """Two connected sockets the relay moves bytes between until both ways end.

    ``counts`` is ``[bytes to the client, bytes to upstream]`` as delivered (``answer`` not
    counted); ``finish`` runs in the trio thread once the relay has closed both sockets;
    ``key`` names whom it belongs to for :meth:`Relay.cut`.
    """

    __slots__ = (
        "client",
        "counts",
        "error",
        "finish",
        "key",
        "last",
        "over",
        "release",
        "upstream",
        "ways",
    )

    def __init__(
        self,
        client: stdsocket.socket,
        upstream: stdsocket.socket,
        counts: list[int],
        finish: Callable[[], None],
        *,
        answer: bytes = b"",
        key: str = "",
        release: Callable[[], None] | None = None,
        own: bool = False,
    ) -> None:
        if not own:  # sockets a trio task may still hold: the relay's own objects for them
            client, upstream = _take_over(client), _take_over(upstream)
        self.client, self.upstream = client, upstream
        self.counts, self.finish, self.key = counts, finish, key
        self.release = release
        """Runs in the relay thread once both sockets are closed (the open count)."""
        self.ways = (
            _Way(self.upstream, self.client, 0, answer),
            _Way(self.client, self.upstream, 1, b""),
        )
        self.last = time.monotonic()
        self.over = False
        self.error: OSError | None = None


class Listener:
    """A listening socket the relay accepts on (level-triggered: one connection per event);
    ``take(listener, conn)`` runs in the relay thread, its lock held, for each connection
    (non-blocking, now ``take``'s own). ``key`` names whom it belongs to for
    :meth:`Relay.unlisten`; ``closed`` is set when it is closed."""

    __slots__ = ("closed", "key", "resume_at", "sock", "take")

    def __init__(
        self,
        sock: stdsocket.socket,
        key: str,
        take: Callable[[Listener, stdsocket.socket], None],
    ) -> None:
        self.sock, self.key, self.take = sock, key, take
        self.closed = False
        self.resume_at = 0.0  # paused after an accept failed (out of descriptors) until then


ACCEPT_PAUSE_S = 0.1
"""A listener whose accept failed (``EMFILE`` and friends) waits this long before the next."""


def _take_over(sock: stdsocket.socket) -> stdsocket.socket:
    """A socket object of the relay's own for ``sock``'s descriptor; ``sock`` is left without
    one (closing it does nothing), so no trio task can wait on or close what the relay uses."""
    return stdsocket.socket(sock.family, sock.type, sock.proto, sock.detach())


FLUSH_S = 0.1
"""At most this long after a tunnel ended, its counts and audit line are in (the trio loop
takes them sooner when it passes anyway)."""


class Relay:
    """The relay thread of one proxy: :meth:`start` (in the trio thread), :meth:`listen` per
    listener it accepts on, :meth:`add` per tunnel (:meth:`carry` in this thread), :meth:`flush`
    whenever convenient, :meth:`stop` at the end (it cuts what is left, closes the listeners,
    joins the thread and flushes)."""

    def __init__(self, *, chunk: int = 64 * 1024, idle_timeout_s: float = 300.0) -> None:
        self.chunk = chunk
        self.idle_timeout_s = idle_timeout_s
        self.sweep_s = min(1.0, idle_timeout_s / 10)
        self.native_id = 0
        """The thread's id in the kernel (benchmarks read its CPU)."""
        # Shared with the trio thread, which adds to them under `_lock`; the relay holds it
        # while it handles what one `epoll_wait` returned (not while it waits).
        self._lock = threading.Lock()
        self._fds: dict[int, Tunnel] = {}
        self._listeners: dict[int, Listener] = {}
        self._paused: list[Listener] = []
        self._tunnels: set[Tunnel] = set()
        self._commands: collections.deque[str | Tunnel | None] = collections.deque()
        self._finished: collections.deque[Tunnel] = collections.deque()
        self._flush_at = 0.0
        self._sweep_at = 0.0
        self._ready: collections.deque[_Way] = collections.deque()
        self._pipes: list[tuple[int, int]] = []  # empty ones, for the next tunnels
        self._epoll: select.epoll | None = None
        self._wake = -1
        self._thread: threading.Thread | None = None
        self._token: trio.lowlevel.TrioToken | None = None

    # the trio side ------------------------------------------------------------------------

    def start(self) -> None:
        """Start the thread (in the trio thread: the relay asks it to flush through its
        token)."""
        self._token = trio.lowlevel.current_trio_token()
        self._epoll = select.epoll()
        try:
            self._wake = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)
            self._epoll.register(self._wake, select.EPOLLIN)
            self._thread = threading.Thread(
                target=self._main, name="toolhost-egress-relay", daemon=True
            )
            self._thread.start()
        except BaseException:
            self._close_own()
            raise

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def add(self, tunnel: Tunnel) -> None:
        """Hand ``tunnel`` (and its sockets) to the relay; its ``finish`` runs at a later
        :meth:`flush`."""
        with self._lock:  # the relay cannot end it (and close a socket) half-registered
            self.carry(tunnel)

    def carry(self, tunnel: Tunnel, *, to_client: bytes = b"", to_upstream: bytes = b"") -> None:
        """:meth:`add`, the lock held (the relay thread's own ``Listener.take``): ``to_client``
        (not counted) and ``to_upstream`` (counted) go out first."""
        assert self._epoll is not None
        self._tunnels.add(tunnel)
        for sock in (tunnel.client, tunnel.upstream):
            self._fds[sock.fileno()] = tunnel  # before the registration: its first event
        try:
            for sock in (tunnel.client, tunnel.upstream):
                self._epoll.register(sock.fileno(), _READ)
        except OSError as exc:  # out of memory for epoll: the relay ends it at once
            tunnel.error = exc
            self._command(tunnel)
            return
        down, up = tunnel.ways
        down.pending, up.buf = to_client, to_upstream
        self._ready.extend(way for way in tunnel.ways if way.pending or way.buf)

    def listen(self, listener: Listener) -> None:
        """Accept on ``listener`` in the relay thread from now on (it owns the socket)."""
        assert self._epoll is not None
        with self._lock:
            fd = listener.sock.fileno()
            self._epoll.register(fd, select.EPOLLIN)
            self._listeners[fd] = listener

    def unlisten(self, key: str) -> None:
        """Close every listener of ``key`` now (a connection to it is refused on return)."""
        with self._lock:
            for listener in [x for x in self._listeners.values() if x.key == key]:
                self._drop(listener)

    def _drop(self, listener: Listener) -> None:
        listener.closed = True
        self._listeners.pop(listener.sock.fileno(), None)
        if listener in self._paused:
            self._paused.remove(listener)
        listener.sock.close()  # leaves the epoll set with it

    def flush(self) -> None:
        """Run the ``finish`` of every tunnel the relay is done with (in the trio thread)."""
        finished = self._finished
        while finished:
            tunnel = finished.popleft()
            try:
                tunnel.finish()
            except Exception:
                log.exception("egress: a tunnel's finish failed")

    def cut(self, key: str) -> None:
        """Ask the relay to end every tunnel of ``key`` (their ``finish`` runs soon after)."""
        self._command(key)

    def _command(self, what: str | Tunnel | None) -> None:
        """A key to cut, a tunnel to end, or None: stop the thread."""
        self._commands.append(what)
        try:
            os.eventfd_write(self._wake, 1)
        except OSError:  # closed: the thread is gone
            pass

    def stop(self) -> None:
        """Cut every tunnel left, stop the thread, close its descriptors and flush."""
        if self._thread is not None and self._thread.is_alive():
            self._command(None)
            self._thread.join(_STOP_WAIT_S)
            if self._thread.is_alive():
                log.error("egress: the relay thread did not stop")
                return
        self._close_own()
        self.flush()

    def _close_own(self) -> None:
        if self._epoll is not None:
            self._epoll.close()
        if self._wake >= 0:
            os.close(self._wake)
            self._wake = -1

    # the relay thread ---------------------------------------------------------------------

    def _main(self) -> None:
        self.native_id = threading.get_native_id()
        try:
            self._loop()
        except Exception:  # a bug: every tunnel is ended, the host keeps running
            log.exception("egress: the relay thread failed")
        finally:
            with self._lock:
                for tunnel in self._tunnels.copy():
                    self._end(tunnel)
                for listener in list(self._listeners.values()):
                    self._drop(listener)
            while self._pipes:
                os.close(self._pipes[-1][0])
                os.close(self._pipes.pop()[1])

    def _loop(self) -> None:
        assert self._epoll is not None
        poll, lock = self._epoll.poll, self._lock
        self._sweep_at = time.monotonic() + self.sweep_s
        while True:
            at = min(self._sweep_at, self._flush_at) if self._flush_at else self._sweep_at
            if self._paused:
                at = min(at, *(x.resume_at for x in self._paused))
            events = poll(0.0 if self._ready else max(0.0, at - time.monotonic()))
            with lock:
                if not self._round(events):
                    return

    def _round(self, events: list[tuple[int, int]]) -> bool:
        """Handle what one ``epoll_wait`` returned, the ways that yielded their turn, idle
        tunnels and the flush timer; False to stop."""
        fds, ready = self._fds, self._ready
        for fd, mask in events:
            if fd == self._wake:
                if not self._commands_in():
                    return False
                continue
            tunnel = fds.get(fd)
            if tunnel is None or tunnel.over:
                listener = self._listeners.get(fd)
                if listener is not None:
                    self._accept(listener)
                continue
            for way in tunnel.ways:
                # a way waits on its source (empty) or its destination (full)
                if (fd == way.fin and mask & _IN) or (fd == way.fout and mask & _OUT):
                    self._step(tunnel, way)
                    if tunnel.over:
                        break
        for _ in range(len(ready)):  # ways that moved a lot in one go: their turn again
            way = ready.popleft()
            tunnel = fds.get(way.fin)
            if tunnel is not None and not tunnel.over and way in tunnel.ways:
                self._step(tunnel, way)
        now = time.monotonic()
        if now >= self._sweep_at:
            self._sweep_at = now + self.sweep_s
            for tunnel in [t for t in self._tunnels.copy() if now - t.last > self.idle_timeout_s]:
                self._end(tunnel)
        for listener in [x for x in self._paused if x.resume_at <= now]:
            self._paused.remove(listener)
            assert self._epoll is not None
            self._epoll.modify(listener.sock.fileno(), select.EPOLLIN)
        if self._flush_at and now >= self._flush_at:
            self._flush_at = 0.0
            if self._finished:  # the trio loop did not pass by since: wake it
                self._ask_flush()
        return True

    def _accept(self, listener: Listener) -> None:
        """Take one connection (level-triggered: the next ``epoll_wait`` reports another)."""
        try:
            conn, _ = listener.sock.accept()
        except (BlockingIOError, ConnectionError):  # none, or gone before it was taken
            return
        except OSError as exc:  # EMFILE and friends: back off, keep serving
            log.warning("egress: accept failed: %s", exc)
            assert self._epoll is not None
            self._epoll.modify(listener.sock.fileno(), 0)
            listener.resume_at = time.monotonic() + ACCEPT_PAUSE_S
            self._paused.append(listener)
            return
        try:
            conn.setblocking(False)  # TCP_NODELAY: the listener's, inherited
            listener.take(listener, conn)
        except Exception:  # a bug: that connection is lost, the relay keeps serving
            log.exception("egress: a connection failed in the relay thread")
            conn.close()

    def _commands_in(self) -> bool:
        """Take the commands (cuts); False to stop."""
        try:
            os.eventfd_read(self._wake)
        except BlockingIOError:
            pass
        while self._commands:
            what = self._commands.popleft()
            if what is None:
                return False
            for tunnel in [t for t in self._tunnels.copy() if t is what or t.key == what]:
                self._end(tunnel)
            self._ask_flush()  # whoever cut them wants to hear of it soon
        return True

    def _ask_flush(self) -> None:
        assert self._token is not None
        try:
            self._token.run_sync_soon(self.flush)
        except trio.RunFinishedError:  # the stop flushes
            pass

    def _step(self, tunnel: Tunnel, way: _Way) -> None:
        """Move what ``way`` can now; a failure ends the tunnel."""
        try:
            if self._move(tunnel, way):
                self._ready.append(way)
        except OSError as exc:
            tunnel.error = exc
            self._end(tunnel)
            return
        if tunnel.ways[0].state == _DONE and tunnel.ways[1].state == _DONE:
            self._end(tunnel)

    def _move(self, tunnel: Tunnel, way: _Way) -> bool:
        """Move bytes until a socket would block or the way ends; True when it stopped only to
        let other tunnels have their turn.

        Raises:
            OSError: A socket failed (reset, broken pipe).
        """
        budget = YIELD_BYTES
        while way.state != _DONE:
            if way.pending:
                flags = stdsocket.MSG_MORE if (way.held or way.buf) else 0
                try:
                    way.pending = way.pending[way.dst.send(way.pending, flags) :]
                except BlockingIOError:
                    return self._arm(way)
            elif way.held or way.buf:
                try:
                    out = self._give(way)
                except BlockingIOError:
                    return self._arm(way)
                tunnel.counts[way.slot] += out
                tunnel.last = time.monotonic()
                budget -= out
                if budget <= 0:
                    return True
            elif way.state == _EOF:
                way.dst.shutdown(stdsocket.SHUT_WR)
                way.state = _DONE
            else:
                try:
                    n = self._take(way)
                except BlockingIOError:
                    return False
                if way.prefix:  # with the first bytes (MSG_MORE), or alone at the end
                    way.pending, way.prefix = way.prefix, b""
                if n == 0:
                    way.state = _EOF
        return False

    def _arm(self, way: _Way) -> bool:
        """Watch ``way``'s full destination for writing too (from now on: rare, and a
        registration changed back and forth would cost more); False."""
        if not way.armed:
            way.armed = True
            assert self._epoll is not None
            self._epoll.modify(way.fout, _READ | select.EPOLLOUT)  # reports it if writable now
        return False

    def _take(self, way: _Way) -> int:
        """From ``src`` into the pipe (or the buffer): how many bytes, 0 at its end."""
        if way.r == _NO_PIPE:
            try:
                way.r, way.w = self._pipes.pop() if self._pipes else _new_pipe()
            except OSError:  # out of descriptors: this way copies through Python
                way.r = way.w = _COPY
        if way.r >= 0:
            try:
                way.held = os.splice(way.fin, way.w, self.chunk, flags=SPLICE_FLAGS)
                return way.held
            except OSError as exc:
                if exc.errno not in NO_SPLICE:
                    raise
                self._drop_pipe(way)
                way.r = way.w = _COPY
        way.buf = way.src.recv(self.chunk)
        return len(way.buf)

    @staticmethod
    def _give(way: _Way) -> int:
        """From the pipe (or the buffer) to ``dst``: how many bytes went."""
        if way.held:
            out = os.splice(way.r, way.fout, way.held, flags=SPLICE_FLAGS)
            way.held -= out
            return out
        out = way.dst.send(way.buf)
        way.buf = way.buf[out:]
        return out

    def _end(self, tunnel: Tunnel) -> None:
        """Let go of ``tunnel``: its sockets leave the epoll set and close, its pipes close, and
        its ``finish`` waits for the next flush."""
        if tunnel.over:
            return
        tunnel.over = True
        self._tunnels.discard(tunnel)
        self._forget_fds(tunnel)
        for sock in (tunnel.client, tunnel.upstream):
            sock.close()  # leaves the epoll set with it
        if tunnel.release is not None:
            tunnel.release()
        for way in tunnel.ways:
            self._drop_pipe(way)
        self._finished.append(tunnel)
        if not self._flush_at:
            self._flush_at = time.monotonic() + FLUSH_S

    def _forget_fds(self, tunnel: Tunnel) -> None:
        for way in tunnel.ways:
            if self._fds.get(way.fin) is tunnel:
                del self._fds[way.fin]

    def _drop_pipe(self, way: _Way) -> None:
        """Keep ``way``'s pipe for another tunnel when it is empty (up to ``PIPES_KEPT``: a
        pipe made and closed per tunnel is six system calls), else close it."""
        if way.r < 0:
            return
        if not way.held and len(self._pipes) < PIPES_KEPT:
            self._pipes.append((way.r, way.w))
        else:
            os.close(way.r)
            os.close(way.w)
        way.r = way.w = _NO_PIPE


PIPES_KEPT = 16
"""Empty pipes the relay keeps for the next tunnels."""


def _new_pipe() -> tuple[int, int]:
    return os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
