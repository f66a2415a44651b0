"""process-json persistent protocol 1 (PROTOCOL 3.1): one JSON object per line.

Wire structs are tolerant: unknown fields are ignored so either side can grow. ``input`` and
``data`` stay :class:`msgspec.Raw` on the host so a call's payload crosses the host without being
decoded and re-encoded.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec
from msgspec import Raw, Struct

NULL = Raw(b"null")
EMPTY_OBJECT = Raw(b"{}")

HealthStatus = Literal["healthy", "degraded", "unavailable"]
ResultCode = Literal["failed", "unavailable", "unsupported", "invalid-input", "cancelled"]


class _Msg(Struct, tag_field="type", kw_only=True, omit_defaults=True):
    """Base of every line: the ``type`` field is the tag."""


# host -> worker


class Init(_Msg, tag="init", kw_only=True):
    protocol: int = 1
    sidecar: str
    config: dict[str, Any] = msgspec.field(default_factory=dict)
    projectDir: str
    configDir: str
    cwd: str
    hostPrivate: list[str] = msgspec.field(default_factory=list)
    """Absolute paths no tool may read or write (PROTOCOL 1, host-private); the SDK refuses
    them in every path check."""


# The ``call`` line: run one tool call (named for what it is on the wire; the host's own state
# machine of a call is ``supervisor.calls.call.Call``).
class CallMessage(_Msg, tag="call", kw_only=True):
    id: int
    tool: str
    input: Raw = msgspec.field(default_factory=lambda: EMPTY_OBJECT)
    deadlineMs: int = 0
    traceparent: str | None = None
    """W3C Trace Context of the host's span for this call (only when tracing is on)."""
    tracestate: str | None = None


class Cancel(_Msg, tag="cancel", kw_only=True):
    id: int


class Ping(_Msg, tag="ping", kw_only=True):
    id: str


class Shutdown(_Msg, tag="shutdown", kw_only=True):
    pass


class ServiceError(Struct, kw_only=True, omit_defaults=True):
    """The error of a host-service ``response`` (PROTOCOL 3.5)."""

    code: str
    message: str


class Response(_Msg, tag="response", kw_only=True):
    """The host's answer to a worker's ``request`` (exactly one of ``result``/``error``)."""

    id: str | int | None
    """The request's id; ``null`` (always written) when the request had no usable id."""
    result: Raw | msgspec.UnsetType = msgspec.UNSET
    """Absent on an error response (a Raw cannot be Optional in msgspec: UNSET is omitted)."""
    error: ServiceError | None = None


HostMessage = Init | CallMessage | Cancel | Ping | Shutdown | Response


# worker -> host


class ToolInfo(Struct, kw_only=True, omit_defaults=True):
    name: str
    description: str = ""
    inputSchema: dict[str, Any] = msgspec.field(default_factory=lambda: {"type": "object"})
    outputSchema: dict[str, Any] | None = None
    annotations: dict[str, Any] | None = None
    """MCP-style behaviour hints (``readOnlyHint``, ``destructiveHint``); a toolhost extension
    of ``ready`` that the host reads for tools no manifest describes."""


class Ready(_Msg, tag="ready", kw_only=True):
    protocol: int = 1
    name: str = ""
    version: str = ""
    concurrency: int = 1
    tools: list[ToolInfo] = msgspec.field(default_factory=list)


class Result(_Msg, tag="result", kw_only=True):
    id: int
    ok: bool
    data: Raw = msgspec.field(default_factory=lambda: NULL)
    content: str | None = None
    code: str | None = None
    error: str | None = None
    details: dict[str, Any] | None = None
    cpuMs: float | None = None
    """CPU milliseconds the call used inside the worker (toolhost SDK extension)."""


class Progress(_Msg, tag="progress", kw_only=True):
    id: int
    data: Raw = msgspec.field(default_factory=lambda: NULL)


class ToolHealth(Struct, kw_only=True, omit_defaults=True):
    status: HealthStatus = "healthy"
    reason: str | None = None
    hint: str | None = None
    code: str | None = None
    """A stable reason code (``probe-timeout``...); default ``probe-<status>``."""


class Pong(_Msg, tag="pong", kw_only=True, omit_defaults=False):
    id: str
    status: HealthStatus = "healthy"
    tools: dict[str, ToolHealth] = msgspec.field(default_factory=dict)


class Log(_Msg, tag="log", kw_only=True):
    level: str = "info"
    message: str = ""


class Request(_Msg, tag="request", kw_only=True):
    """A worker asks the host for a service while one of its calls is in flight (PROTOCOL 3.5).

    Every field is optional here so that a malformed request reaches the host's services (which
    answer ``invalid-request``) instead of breaking the protocol.
    """

    id: str | int | None = None
    callId: int | None = None
    method: str | None = None
    params: Raw = msgspec.field(default_factory=lambda: EMPTY_OBJECT)


WorkerMessage = Ready | Result | Progress | Pong | Log | Request

RESULT_CODES: frozenset[str] = frozenset(
    ("failed", "unavailable", "unsupported", "invalid-input", "cancelled")
)

# Built once: the host decodes worker lines and encodes host lines; the SDK does the reverse.
worker_decoder: msgspec.json.Decoder[WorkerMessage] = msgspec.json.Decoder(WorkerMessage)
host_decoder: msgspec.json.Decoder[HostMessage] = msgspec.json.Decoder(HostMessage)
encoder = msgspec.json.Encoder()
