"""The result envelope every invocation ends in (PROTOCOL 5)."""

from __future__ import annotations

from typing import Any, Literal

import msgspec
from msgspec import Raw, Struct

from supervisor.contracts.wire import NULL

Status = Literal["success", "failed", "unavailable"]

# Codes of ``error.code`` by status (PROTOCOL 5). Sidecars may add their own ``failed`` codes.
UNAVAILABLE_CODES = frozenset(
    (
        "unknown-tool",
        "not-visible",
        "approval-required",
        "sandbox-denied",
        "quota-limited",
        "overloaded",
        "unavailable",
        "unsupported",
        "shutting-down",
    )
)
FAILED_CODES = frozenset(
    (
        "failed",
        "invalid-input",
        "timeout",
        "cancelled",
        "worker-crashed",
        "protocol-error",
        "output-too-large",
        "quota-exceeded",
    )
)


class ErrorInfo(Struct, kw_only=True, omit_defaults=True):
    code: str
    message: str
    exitCode: int | None = None
    stderr: str | None = None
    details: dict[str, Any] | None = None


class Meta(Struct, kw_only=True, omit_defaults=True):
    durationMs: float = 0.0
    sidecar: str | None = None
    pid: int | None = None
    attempts: int = 1
    truncated: bool = False
    originalBytes: int | None = None
    """With ``truncated``: the size of content + data before the cut."""
    cpuMs: float | None = None


class Envelope(Struct, kw_only=True):
    """``data`` is kept as raw JSON on the host: it is copied, never re-encoded."""

    status: Status
    tool: str
    content: str
    data: Raw = msgspec.field(default_factory=lambda: NULL)
    error: ErrorInfo | None = None
    meta: Meta = msgspec.field(default_factory=Meta)


class EnvelopeView(Struct, kw_only=True):
    """The envelope as a client decodes it (``data`` as plain values)."""

    status: Status
    tool: str
    content: str
    data: Any = None
    error: ErrorInfo | None = None
    meta: Meta = msgspec.field(default_factory=Meta)
