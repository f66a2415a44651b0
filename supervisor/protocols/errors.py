"""Protocol errors raised by the sans-IO state machines."""

from __future__ import annotations

from typing import Any


class ProtocolError(Exception):
    """The peer broke its protocol; the connection is unusable afterwards.

    Attributes:
        message: What was wrong, in words an operator can act on.
    """

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message
        self.accepted: list[Any] = []
        """Messages decoded from the same input before the breach (still valid to act on)."""


class LineTooLong(ProtocolError):
    """A line exceeded the configured limit."""
