"""The client's end of an in-memory kernel connection (``server/memory.py`` is the host's).

# Strategy: kept apart from the host's end, with nothing but trio and the contracts, so the
# kernel client (``supervisor/client.py``, imported by every CLI command) can tell a link from a
# socket without importing the server's session, methods and host. Both ends live in one
# process, so what needs no bytes is handed over as objects: a request whose params are already
# the method's struct (``tools.invoke`` from the MCP face), the response to a request the client
# made ``typed`` (the call's envelope), and a result that is JSON already (a hosted server's
# read) for a request that wants JSON, taken by the client's reader at once. Everything else is
# a frame, as on a socket.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import trio

from supervisor.contracts.rpc import Request

Outgoing = bytes | Request
"""What the client hands the host: a frame, or a request already decoded (its ``params`` the
method's params struct)."""


class FrameLink(trio.abc.AsyncResource):
    """The client's end: :meth:`send` a frame to the host, read the host's from ``frames``.

    Args:
        deliver: Hands one frame to the host's end.
        hang_up: Tells the host's end that the client left.
    """

    def __init__(self, deliver: Callable[[Outgoing], None], hang_up: Callable[[], None]) -> None:
        self._deliver = deliver
        self._hang_up = hang_up
        self.to_client, self.frames = trio.open_memory_channel[bytes](math.inf)
        """The host's end sends on ``to_client`` (and closes it when it is done)."""
        self.on_frame: Callable[[bytes], None] | None = None
        """Set by the client's reader once it runs: the host's end hands it each answer at once
        (:meth:`to_client_now`), in the host's task, with no task hop per answer. It never
        raises (the reader keeps a failure and raises it in its own task)."""
        self.on_object: Callable[[Any, Any], bool] | None = None
        """Set by the client's reader once it runs: offered each response as its id and result
        object (:meth:`answer_now`); True when it took it (a ``typed`` request, or JSON for a
        request that wants JSON), False to have it as a frame. It never raises."""
        self.queued = 0
        """Frames on ``to_client`` the client's reader has not taken yet."""
        self.closed = False

    def send(self, frame: Outgoing) -> None:
        """One frame, or decoded request, to the host (dropped once the client closed its
        end)."""
        if not self.closed:
            self._deliver(frame)

    def to_client_now(self, frame: bytes) -> None:
        """The host's end: one frame to the client. An answer (``{"id"``: a response or an
        error) goes at once to :attr:`on_frame` when nothing is queued ahead of it; an event,
        or anything before the reader runs, through ``to_client`` (in order, in the reader's
        task, as on a socket). Raises ``trio.ClosedResourceError`` once the host's end closed.
        """
        take = self.on_frame
        if take is not None and not self.queued and frame.startswith(b'{"id"'):
            take(frame)
            return
        self.to_client.send_nowait(frame)
        self.queued += 1

    def answer_now(self, request_id: Any, result: Any, frame_of: Callable[[], bytes]) -> None:
        """The host's end: the response to ``request_id``. The result object goes to
        :attr:`on_object` when nothing is queued ahead of it and the client takes it as an
        object; else the frame ``frame_of`` encodes goes as in :meth:`to_client_now` (encoded
        now, so nothing the host changes later reaches the client). Raises
        ``trio.ClosedResourceError`` once the host's end closed."""
        take = self.on_object
        if take is not None and not self.queued and take(request_id, result):
            return
        self.to_client_now(frame_of())

    def close(self) -> None:
        """The client hangs up."""
        if not self.closed:
            self.closed = True
            self._hang_up()

    async def aclose(self) -> None:
        self.close()
        await trio.lowlevel.checkpoint()
