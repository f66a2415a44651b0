"""The kernel protocol (PROTOCOL 6): request, response, event, and each method's params.

Requests are tolerant (clients may send fields a later version understands). ``params`` stays
:class:`msgspec.Raw` until the method is known, then is decoded into that method's struct with
the connection's codec (JSON or MessagePack).
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec
from msgspec import Raw, Struct

from supervisor.contracts.snapshot import Descriptor, SidecarStatus, ZygoteStatus
from supervisor.contracts.wire import EMPTY_OBJECT

PROTOCOL_NAME = "toolhost/1"

MSGPACK_REFUSES = (OverflowError, TypeError, ValueError, RecursionError, msgspec.EncodeError)
"""What MessagePack encoding raises for a value it cannot carry (valid JSON such as an integer
over 64 bits): the codec answers with an error instead, the catalog keeps such a schema out."""

RequestId = int | str

ERROR_CODES = frozenset(
    (
        "invalid-request",
        "unknown-method",
        "invalid-params",
        "unauthorized",
        "not-found",
        "overloaded",
        "internal",
    )
)


class Request(Struct, kw_only=True):
    id: RequestId
    method: str
    params: Raw = msgspec.field(default_factory=lambda: EMPTY_OBJECT)


class RpcError(Struct, kw_only=True, omit_defaults=True):
    code: str
    message: str
    data: dict[str, Any] | None = None


class Response(Struct, kw_only=True):
    id: RequestId
    result: Any


class ErrorResponse(Struct, kw_only=True):
    id: RequestId | None
    error: RpcError


class Event(Struct, kw_only=True, omit_defaults=True):
    event: str
    data: Any = None
    id: RequestId | None = None


# Method params ---------------------------------------------------------------------------


class ClientInfo(Struct, kw_only=True):
    name: str = ""
    version: str = ""


class HelloParams(Struct, kw_only=True):
    client: ClientInfo | None = None
    encoding: Literal["json", "msgpack"] | None = None
    """Switch the connection's encoding after the response; absent keeps the current one."""


class EmptyParams(Struct, kw_only=True):
    pass


class ListParams(Struct, kw_only=True):
    format: Literal["native", "openai", "anthropic", "mcp"] = "native"


class Approval(Struct, kw_only=True):
    granted: bool
    by: str = ""


class TraceContext(Struct, kw_only=True):
    """``params.trace`` of any request: W3C Trace Context the host's spans join (PROTOCOL 6)."""

    traceparent: str
    tracestate: str | None = None


class InvokeParams(Struct, kw_only=True):
    tool: str
    input: Raw = msgspec.field(default_factory=lambda: EMPTY_OBJECT)
    timeoutMs: int | None = None
    approval: Approval | None = None
    stream: bool = False
    session: str | None = None
    """The kernel's session: the scope of ``session`` state (PROTOCOL 3.5)."""
    trace: TraceContext | None = None
    """The caller's trace: the call's spans become its children (docs/telemetry.md)."""


class CancelParams(Struct, kw_only=True):
    id: RequestId


class RestartParams(Struct, kw_only=True):
    sidecar: str
    force: bool = False
    """Required when calls are running or queued: they end ``failed`` (``cancelled`` or
    ``worker-crashed``)."""


# Results ---------------------------------------------------------------------------------


class ServerInfo(Struct, kw_only=True):
    name: str
    version: str


class RegistryStatus(Struct, kw_only=True, omit_defaults=True):
    """Where the registry came from and what was wrong with it as a whole."""

    files: list[str] = msgspec.field(default_factory=list)
    errors: list[str] = msgspec.field(default_factory=list)


class Catalog(Struct, kw_only=True):
    revision: int
    tools: list[Descriptor]
    sidecars: list[SidecarStatus]
    registry: RegistryStatus = msgspec.field(default_factory=RegistryStatus)
    zygote: ZygoteStatus | None = None
    """The host's zygote (docs/zygote.md); None when it is off."""


class HelloResult(Struct, kw_only=True):
    protocol: str
    server: ServerInfo
    capabilities: dict[str, Any]
    kits: Catalog


class HealthCounts(Struct, kw_only=True):
    available: int = 0
    degraded: int = 0
    unavailable: int = 0
    disabled: int = 0


class HealthResult(Struct, kw_only=True):
    status: Literal["ok", "degraded"]
    uptimeMs: float
    sidecars: HealthCounts
    tools: HealthCounts = msgspec.field(default_factory=HealthCounts)
    ready: bool = True
    """Extension (docs/deploy.md): every ``critical: true`` sidecar is available."""
    critical: dict[str, str] = msgspec.field(default_factory=dict)
    """Extension: each critical sidecar's state (available, degraded, unavailable, disabled)."""


class CatalogChanged(Struct, kw_only=True):
    """``catalog.changed``: descriptors changed or added since the last event, and the names of
    tools that left the catalog (PROTOCOL 6)."""

    revision: int
    tools: list[Descriptor]
    removed: list[str] = msgspec.field(default_factory=list)
