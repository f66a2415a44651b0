"""What a sidecar said about one call, in the host's terms, whatever protocol carried it.

Every protocol parser ends in an :class:`Answer`; the runtime adds what only it knows (pid, exit
status, stderr tail) and the result funnel (:mod:`supervisor.policy.results`) makes the envelope.
"""

from __future__ import annotations

import signal
from typing import Any

import msgspec

from supervisor.contracts.wire import NULL

PREVIEW_BYTES = 200


class Answer(msgspec.Struct, kw_only=True):
    """One call's answer: ``ok`` with data and text, or a failure code with a message."""

    ok: bool
    data: msgspec.Raw = NULL
    content: str | None = None
    code: str | None = None
    error: str | None = None
    details: dict[str, Any] | None = None


def failure(code: str, error: str, **details: Any) -> Answer:
    """A failed answer the host made up (the sidecar said nothing usable)."""
    return Answer(ok=False, code=code, error=error, details=details or None)


def describe_status(rc: int | None) -> str:
    """``exit status 3`` / ``killed by SIGKILL`` / ``still running``."""
    if rc is None:
        return "still running"
    if rc < 0:
        try:
            return f"killed by {signal.Signals(-rc).name}"
        except ValueError:
            return f"killed by signal {-rc}"
    return f"exit status {rc}"


def preview(data: bytes, limit: int = PREVIEW_BYTES) -> str:
    """A short, printable quote of some output for an error message."""
    text = data[:limit].decode("utf-8", "replace").strip()
    return repr(text + ("..." if len(data) > limit else ""))


def raw_json(value: Any) -> msgspec.Raw:
    """``value`` as raw JSON (``null`` for None)."""
    if value is None:
        return NULL
    return msgspec.Raw(msgspec.json.encode(value))
