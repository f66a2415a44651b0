"""Protocol errors raised by the sans-IO state machines."""

from __future__ import annotations


class ProtocolError(Exception):
    """The peer broke its protocol; the connection is unusable afterwards.

    Attributes:
        message: What was wrong, in words an operator can act on.
    """

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class LineTooLong(ProtocolError):
    """A line exceeded the configured limit."""
