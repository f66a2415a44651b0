"""The result funnel (PROTOCOL 5): every way a call can end becomes exactly one envelope.

Pure: no trio, no clock. ``content`` is never empty; ``data`` survives a failure when the sidecar
gave some; output over the limit is cut with ``meta.truncated`` and a visible marker.
"""

from __future__ import annotations

from typing import Any

import msgspec

from supervisor.contracts.envelope import UNAVAILABLE_CODES, Envelope, ErrorInfo, Meta, Status
from supervisor.contracts.wire import NULL

CONTENT_PREVIEW_BYTES = 16 * 1024
TRUNCATION_MARKER = "\n[... truncated by toolhost: output was {size} bytes, limit {limit}]"


def _text_of(raw: msgspec.Raw, limit: int) -> tuple[str, bool]:
    data = bytes(raw)
    if len(data) <= limit:
        return data.decode("utf-8", "replace"), False
    return data[:limit].decode("utf-8", "ignore"), True


def unavailable(
    tool: str,
    code: str,
    message: str,
    *,
    details: dict[str, Any] | None = None,
    sidecar: str | None = None,
    duration_ms: float = 0.0,
) -> Envelope:
    """A refusal: nothing ran (unknown tool, not visible, policy, quota, overload)."""
    return Envelope(
        status="unavailable",
        tool=tool,
        content=message or f"{tool} is unavailable ({code})",
        error=ErrorInfo(code=code, message=message, details=details),
        meta=Meta(durationMs=duration_ms, sidecar=sidecar, attempts=0),
    )


def failed(
    tool: str,
    code: str,
    message: str,
    *,
    sidecar: str | None = None,
    pid: int | None = None,
    exit_code: int | None = None,
    stderr: str | None = None,
    details: dict[str, Any] | None = None,
    data: msgspec.Raw = NULL,
    duration_ms: float = 0.0,
    attempts: int = 1,
    cpu_ms: float | None = None,
) -> Envelope:
    """The capability was there and this call failed."""
    return Envelope(
        status="failed",
        tool=tool,
        content=message or f"{tool} failed ({code})",
        data=data,
        error=ErrorInfo(
            code=code, message=message, exitCode=exit_code, stderr=stderr, details=details
        ),
        meta=Meta(
            durationMs=duration_ms, sidecar=sidecar, pid=pid, attempts=attempts, cpuMs=cpu_ms
        ),
    )


def from_answer(
    tool: str,
    *,
    ok: bool,
    data: msgspec.Raw,
    content: str | None,
    code: str | None,
    error: str | None,
    details: dict[str, Any] | None,
    sidecar: str | None,
    pid: int | None,
    duration_ms: float,
    max_output_bytes: int,
    attempts: int = 1,
    cpu_ms: float | None = None,
    exit_code: int | None = None,
    stderr: str | None = None,
) -> Envelope:
    """An envelope from a sidecar's answer (or a host-made failure with the same fields)."""
    if not ok:
        code = code or "failed"
        status: Status = "unavailable" if code in UNAVAILABLE_CODES else "failed"
        message = error or f"{tool} failed ({code})"
        env = Envelope(
            status=status,
            tool=tool,
            content=message,
            data=data,
            error=ErrorInfo(
                code=code, message=message, exitCode=exit_code, stderr=stderr, details=details
            ),
            meta=Meta(
                durationMs=duration_ms, sidecar=sidecar, pid=pid, attempts=attempts, cpuMs=cpu_ms
            ),
        )
        return _readable(_cap(env, max_output_bytes))
    if content:
        text = content
    elif data == NULL or not len(data):
        text = f"{tool} succeeded with no output"
    else:
        text, cut = _text_of(data, CONTENT_PREVIEW_BYTES)
        if cut:
            text += f"\n[... {len(data)} bytes in all; the full result is in data]"
    env = Envelope(
        status="success",
        tool=tool,
        content=text,
        data=data,
        meta=Meta(
            durationMs=duration_ms, sidecar=sidecar, pid=pid, attempts=attempts, cpuMs=cpu_ms
        ),
    )
    return _readable(_cap(env, max_output_bytes))


CHECKED_BYTES = 1 << 20
"""Data up to this size is decoded whole once (:func:`unreadable`); larger data (an operator
raised ``maxOutputBytes``) passes as the sidecar wrote it."""


def unreadable(data: msgspec.Raw) -> str | None:
    """Why a sidecar's JSON (valid to the host's scan) is JSON its clients cannot read, or None:
    a number past a double (``1e400``), which msgspec, Go and serde refuse whole, so one such
    frame would end a kernel's connection and every call on it. Checked up to
    ``CHECKED_BYTES`` (a full decode: ~1 µs for a typical result, ~25 µs for 64 KiB)."""
    if len(data) > CHECKED_BYTES:
        return None
    try:
        msgspec.json.decode(data)
    except (msgspec.ValidationError, msgspec.DecodeError, RecursionError) as exc:
        return str(exc)
    return None


def _readable(env: Envelope) -> Envelope:
    """``env``, its data withheld when it is JSON clients cannot read (:func:`unreadable`): a
    success becomes a failure saying so; a failure keeps its error, and its content says so."""
    if env.data is NULL:
        return env
    why = unreadable(env.data)
    if why is None:
        return env
    message = f"{env.tool} answered JSON its clients cannot read ({why}); the data is withheld"
    if env.status != "success":
        env.data = NULL
        env.content = f"{env.content}\n[{message}]"
        return env
    return Envelope(
        status="failed",
        tool=env.tool,
        content=message,
        error=ErrorInfo(code="protocol-error", message=message),
        meta=env.meta,
    )


def _cap(env: Envelope, limit: int) -> Envelope:
    """Apply ``maxOutputBytes`` to data + content."""
    if limit <= 0:
        return env
    data_len = len(env.data) if env.data is not NULL else 0
    content_bytes = env.content.encode("utf-8")
    size = data_len + len(content_bytes)
    if size <= limit:
        return env
    if data_len > limit // 2 or data_len > limit - len(content_bytes):
        # The structured data cannot be cut and stay valid: the model keeps the cut text.
        source = bytes(env.data) if data_len >= len(content_bytes) else content_bytes
        env.data = NULL
    else:
        source = content_bytes
    room = max(0, limit - data_len if env.data is not NULL else limit)
    cut = source[:room].decode("utf-8", "ignore")
    env.content = cut + TRUNCATION_MARKER.format(size=size, limit=limit)
    env.meta.truncated = True
    env.meta.originalBytes = size
    return env
