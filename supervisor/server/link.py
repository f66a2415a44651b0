"""The client's end of an in-memory kernel connection (``server/memory.py`` is the host's).

# Strategy: kept apart from the host's end, with nothing but trio, so the kernel client
# (``supervisor/client.py``, imported by every CLI command) can tell a link from a socket
# without importing the server's session, methods and host.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import trio


class FrameLink(trio.abc.AsyncResource):
    """The client's end: :meth:`send` a frame to the host, read the host's from ``frames``.

    Args:
        deliver: Hands one frame to the host's end.
        hang_up: Tells the host's end that the client left.
    """

    def __init__(self, deliver: Callable[[bytes], None], hang_up: Callable[[], None]) -> None:
        self._deliver = deliver
        self._hang_up = hang_up
        self.to_client, self.frames = trio.open_memory_channel[bytes](math.inf)
        """The host's end sends on ``to_client`` (and closes it when it is done)."""
        self.closed = False

    def send(self, frame: bytes) -> None:
        """One frame to the host (dropped once the client closed its end)."""
        if not self.closed:
            self._deliver(frame)

    def close(self) -> None:
        """The client hangs up."""
        if not self.closed:
            self.closed = True
            self._hang_up()

    async def aclose(self) -> None:
        self.close()
        await trio.lowlevel.checkpoint()
