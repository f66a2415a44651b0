"""systemd's ``sd_notify`` protocol, in a few lines over a Unix datagram socket (no libsystemd).

# Strategy: ``toolhost serve`` under ``Type=notify`` sends ``READY=1`` once the registry is
# loaded and the socket listens, ``STATUS=`` with the count of available tools (again whenever
# it changes), ``WATCHDOG=1`` every half ``WATCHDOG_USEC`` while the event loop runs, and
# ``STOPPING=1`` when it starts to drain. Without ``NOTIFY_SOCKET`` every call is a no-op.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Awaitable, Callable, Mapping

import trio

log = logging.getLogger("toolhost.systemd")


class Notifier:
    """Sends notifications to ``$NOTIFY_SOCKET`` (path, or ``@name`` for the abstract namespace).

    Args:
        environ: Where to read ``NOTIFY_SOCKET``, ``WATCHDOG_USEC`` and ``WATCHDOG_PID``.
    """

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        address = env.get("NOTIFY_SOCKET", "")
        self.address: str | bytes | None = None
        if address.startswith("@"):
            self.address = b"\0" + address[1:].encode()
        elif address.startswith("/"):
            self.address = address
        self.watchdog_s: float | None = None
        usec = env.get("WATCHDOG_USEC", "")
        pid = env.get("WATCHDOG_PID", "")
        if usec.isdigit() and int(usec) > 0 and (not pid or pid == str(os.getpid())):
            self.watchdog_s = int(usec) / 1e6 / 2
        self._last_status: str | None = None

    @property
    def enabled(self) -> bool:
        return self.address is not None

    def notify(self, *fields: str) -> bool:
        """Send ``fields`` (``"READY=1"``, ``"STATUS=..."``) as one datagram; False on failure."""
        if self.address is None:
            return False
        data = "\n".join(fields).encode()
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as s:
                s.sendto(data, self.address)
        except OSError as exc:
            log.warning("sd_notify to %s failed: %s", os.environ.get("NOTIFY_SOCKET"), exc)
            return False
        return True

    def ready(self, status: str) -> None:
        """``READY=1`` with the first ``STATUS=``."""
        self._last_status = status
        self.notify("READY=1", f"STATUS={status}")

    def status(self, text: str) -> None:
        """``STATUS=text``, only when it changed."""
        if text != self._last_status:
            self._last_status = text
            self.notify(f"STATUS={text}")

    async def watchdog(self) -> None:
        """``WATCHDOG=1`` every half watchdog interval, until cancelled (no-op without one)."""
        if self.watchdog_s is None or self.address is None:
            return
        while True:
            self.notify("WATCHDOG=1")
            await trio.sleep(self.watchdog_s)

    async def follow_status(
        self, text: Callable[[], str], changed: Callable[[], Awaitable[None]]
    ) -> None:
        """Keep ``STATUS=`` current: ``text()`` after every ``await changed()``."""
        if self.address is None:
            return
        while True:
            self.status(text())
            await changed()
