"""The process-json conversation with the host (PROTOCOL 3.1), without IO: lines in, lines out.

# Strategy: like h11's ``Connection`` or hypercorn's protocol classes, a :class:`Session` knows
# the protocol and none of the IO: a driver (threads or Trio) reads host lines however it likes
# and feeds each to :meth:`Session.dispatch`, which decodes it, keeps the book of calls in flight
# and of host-service requests out, and tells the driver what to do (start a call, answer a ping,
# stop a cancelled call) through the small :class:`Driver` interface; every line the sidecar
# sends leaves through the one ``write`` function it was given. It never reads, starts a thread,
# sleeps or imports trio. Its rule is that every call is answered exactly once: :meth:`answer`,
# a host ``cancel`` and :meth:`close` each take the call out of the book under one lock, and only
# the one that took it out writes its result, whichever thread (a worker, the loop) gets there
# first. A call's cancel flag is a ``threading.Event`` because that is what ``ctx.cancelled`` is
# for every tool, sync or async.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, Protocol

import msgspec

from supervisor.contracts import wire

_encode = msgspec.json.Encoder().encode
_decode = wire.host_decoder.decode


class Driver(Protocol):
    """What a driver does with the host's messages (the session keeps the books)."""

    def call(self, call: wire.CallMessage, cancelled: threading.Event) -> None:
        """Start ``call``; ``cancelled`` is set when the host cancels it or the session closes."""

    def ping(self, ping_id: str) -> None:
        """Answer the ping (:meth:`Session.send` a ``Pong``), now or when the check returns."""

    def cancelled(self, call_id: int) -> None:
        """The host cancelled ``call_id`` (its flag is set, its answer about to go out): stop
        what the driver can stop (an async call's cancel scope)."""


class Waiter(Protocol):
    """Someone waiting for the response to a host-service request (``sidecars.sdk.services``)."""

    def wake(self, response: wire.Response) -> None: ...


class Session:
    """One sidecar's process-json session: calls in flight, requests out, lines to send.

    Args:
        write: Sends whole lines to the host (thread-safe).
        log: ``log(level, message)`` on stderr.
    """

    def __init__(self, write: Callable[[bytes], None], log: Callable[[str, str], None]) -> None:
        self._write = write
        self._log = log
        self._calls_lock = threading.Lock()
        self._calls: dict[int, threading.Event] = {}
        self._requests_lock = threading.Lock()
        self._seq = 0
        self._waiting: dict[str, Waiter] = {}

    # lines in ----------------------------------------------------------------------------

    def dispatch(self, line: bytes, driver: Driver) -> bool:
        """Handle one line from the host; False once the host said ``shutdown``.

        The one read loop of every line driver is ``for line in lines: if not dispatch: break``.
        """
        try:
            msg = _decode(line)
        except msgspec.DecodeError as exc:
            self._log("error", f"bad message from host: {exc}")
            return True
        if isinstance(msg, wire.CallMessage):
            flag = threading.Event()
            with self._calls_lock:
                self._calls[msg.id] = flag
            driver.call(msg, flag)
        elif isinstance(msg, wire.Ping):
            driver.ping(msg.id)
        elif isinstance(msg, wire.Cancel):
            self._cancel(msg.id, driver)
        elif isinstance(msg, wire.Response):
            self._settle(msg)
        elif isinstance(msg, wire.Shutdown):
            return False
        return True

    def _cancel(self, call_id: int, driver: Driver) -> None:
        with self._calls_lock:
            flag = self._calls.pop(call_id, None)
        if flag is None:
            return  # already answered: the host ignores anything later
        flag.set()
        driver.cancelled(call_id)
        self.send(wire.Result(id=call_id, ok=False, code="cancelled", error="call cancelled"))

    def _settle(self, response: wire.Response) -> None:
        with self._requests_lock:
            waiter = self._waiting.pop(str(response.id), None)
        if waiter is not None:
            waiter.wake(response)

    def close(self) -> None:
        """The host closed the connection (EOF or ``shutdown``): wake every request with
        ``host-gone``, then answer the calls still in flight ``cancelled``."""
        with self._requests_lock:
            waiting, self._waiting = self._waiting, {}
        for rid, waiter in waiting.items():
            error = wire.ServiceError(code="host-gone", message="the host closed the connection")
            waiter.wake(wire.Response(id=rid, error=error))
        with self._calls_lock:
            pending, self._calls = self._calls, {}
        for call_id, flag in pending.items():
            flag.set()
            self.send(
                wire.Result(id=call_id, ok=False, code="cancelled", error="sidecar shutting down")
            )

    # lines out ---------------------------------------------------------------------------

    def send(self, msg: wire.Ready | wire.Result | wire.Progress | wire.Pong | wire.Log) -> None:
        """Send one message as it is (``ready``, ``pong``; results go through :meth:`answer`)."""
        self._write(_encode(msg) + b"\n")

    def answer(self, result: wire.Result) -> None:
        """Send call ``result.id``'s result, unless it was answered already (cancelled)."""
        with self._calls_lock:
            if self._calls.pop(result.id, None) is None:
                return  # cancelled meanwhile; that answer already went out
        self._write(_encode(result) + b"\n")

    def progress(self, call_id: int, data: Any) -> None:
        """Send a ``progress`` event of call ``call_id``."""
        self.send(wire.Progress(id=call_id, data=msgspec.Raw(_encode(data))))

    def request(self, call_id: int, method: str, params: Any, waiter: Waiter) -> str:
        """Send a host-service request for call ``call_id``; ``waiter`` is woken with the
        response (or ``host-gone`` at :meth:`close`). Returns the request's id."""
        with self._requests_lock:
            self._seq += 1
            rid = f"s{self._seq}"
            self._waiting[rid] = waiter
        request = wire.Request(
            id=rid, callId=call_id, method=method, params=msgspec.Raw(_encode(params))
        )
        self._write(_encode(request) + b"\n")
        return rid

    def forget(self, rid: str) -> None:
        """Stop waiting for request ``rid`` (its call was cancelled); a late response is dropped."""
        with self._requests_lock:
            self._waiting.pop(rid, None)
