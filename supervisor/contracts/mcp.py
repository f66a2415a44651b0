"""Model Context Protocol messages over stdio (PROTOCOL 3.4): JSON-RPC 2.0, one object per line.

Only what the host needs as an MCP *client* (hosting MCP servers) and as an MCP *server*
(``toolhost mcp``) is modelled: the lifecycle of both eras (the handshake: ``initialize``,
``notifications/initialized``; the stateless 2026-07-28 revision: ``server/discover`` and the
per-request ``_meta`` envelope, ``subscriptions/listen``), ``tools/list``, ``tools/call``,
``ping``, progress, cancellation and ``notifications/tools/list_changed``. Every struct is
tolerant (unknown fields ignored) so a newer server stays readable; payloads the host only
forwards (``arguments``, ``structuredContent``, content blocks) stay :class:`msgspec.Raw`.
"""

from __future__ import annotations

from typing import Any

import msgspec
from msgspec import UNSET, Raw, Struct, UnsetType

PROTOCOL_VERSION = "2025-11-25"
"""The revision the host asks for; it accepts whatever revision the server answers."""

SERVER_VERSIONS = ("2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05")
"""The revisions ``toolhost mcp`` speaks, newest first; a client asking for another one gets the
newest (the client then decides whether it can go on)."""

MODERN_VERSIONS = ("2026-07-28",)
"""The stateless revisions (``server/discover``, every request carrying its own ``_meta``
envelope, no session), newest first. Spoken to clients that ask for them and, first, to hosted
servers (PROTOCOL 3.4)."""

PROTOCOL_VERSION_KEY = "io.modelcontextprotocol/protocolVersion"
"""Request ``_meta`` key (stateless era): the revision of this one request."""
CLIENT_INFO_KEY = "io.modelcontextprotocol/clientInfo"
"""Request ``_meta`` key (stateless era): the client's ``Implementation``."""
CLIENT_CAPABILITIES_KEY = "io.modelcontextprotocol/clientCapabilities"
"""Request ``_meta`` key (stateless era): the client's capabilities, required with the version."""
SERVER_INFO_KEY = "io.modelcontextprotocol/serverInfo"
"""Result ``_meta`` key (stateless era): the server's ``Implementation``."""
SUBSCRIPTION_ID_KEY = "io.modelcontextprotocol/subscriptionId"
"""``_meta`` key of every frame of a ``subscriptions/listen`` stream: the listen request's id."""

RequestId = int | str

# JSON-RPC error codes the host produces or maps.
PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
# MCP's own (stateless era).
HEADER_MISMATCH = -32020
"""The HTTP routing headers disagree with the body (or are missing)."""
UNSUPPORTED_VERSION = -32022
"""The request's revision is not one the server speaks; ``data: {supported, requested}``."""


class RpcErrorInfo(Struct, kw_only=True, omit_defaults=True):
    """The ``error`` member of a JSON-RPC response."""

    code: int = INTERNAL_ERROR
    message: str = ""
    data: Any = None


class Incoming(Struct, kw_only=True):
    """Any line a server writes: a request, a notification or a response.

    ``id`` is UNSET for notifications (absent), None for a response that could not be tied to a
    request (``"id": null``).
    """

    jsonrpc: str = "2.0"
    id: RequestId | UnsetType | None = UNSET
    method: str | UnsetType = UNSET
    params: Raw | UnsetType = UNSET
    result: Raw | UnsetType = UNSET
    error: RpcErrorInfo | UnsetType = UNSET


# client -> server -------------------------------------------------------------------------


class OutRequest(Struct, kw_only=True):
    """A request; ``jsonrpc`` is always written (UNSET ``params`` is left out)."""

    jsonrpc: str = "2.0"
    id: RequestId
    method: str
    params: Any | UnsetType = UNSET


class OutNotification(Struct, kw_only=True):
    jsonrpc: str = "2.0"
    method: str
    params: Any | UnsetType = UNSET


class OutResult(Struct, kw_only=True):
    jsonrpc: str = "2.0"
    id: RequestId
    result: Any


class OutError(Struct, kw_only=True):
    jsonrpc: str = "2.0"
    id: RequestId | None
    error: RpcErrorInfo


class Implementation(Struct, kw_only=True, omit_defaults=True):
    name: str = ""
    version: str = ""
    title: str | None = None


class InitializeParams(Struct, kw_only=True):
    protocolVersion: str
    capabilities: dict[str, Any]
    clientInfo: Implementation


class ListToolsParams(Struct, kw_only=True, omit_defaults=True):
    cursor: str | None = None
    meta: RequestMeta | None = msgspec.field(default=None, name="_meta")


class SubscriptionFilter(Struct, kw_only=True, omit_defaults=True):
    """What a ``subscriptions/listen`` stream carries (stateless era)."""

    toolsListChanged: bool | None = None
    promptsListChanged: bool | None = None
    resourcesListChanged: bool | None = None
    resourceSubscriptions: list[str] | None = None


class ListenParams(Struct, kw_only=True, omit_defaults=True):
    """``subscriptions/listen`` params."""

    notifications: SubscriptionFilter = msgspec.field(default_factory=SubscriptionFilter)
    meta: RequestMeta | None = msgspec.field(default=None, name="_meta")


class RequestMeta(Struct, kw_only=True, omit_defaults=True):
    progressToken: RequestId | None = None
    traceparent: str | None = None
    """W3C Trace Context in ``params._meta`` (OpenTelemetry MCP conventions)."""
    tracestate: str | None = None
    protocol_version: Any = msgspec.field(default=UNSET, name=PROTOCOL_VERSION_KEY)
    """The stateless era's envelope (UNSET, so never written, in the handshake era); ``Any`` so a
    server can tell a missing key from a value of the wrong type."""
    client_info: Any = msgspec.field(default=UNSET, name=CLIENT_INFO_KEY)
    client_capabilities: Any = msgspec.field(default=UNSET, name=CLIENT_CAPABILITIES_KEY)


class MetaParams(Struct, kw_only=True, omit_defaults=True):
    """Params of a request that has nothing but ``_meta`` (``server/discover``; any request, read
    only for its envelope)."""

    meta: RequestMeta | None = msgspec.field(default=None, name="_meta")


class CallToolParams(Struct, kw_only=True, omit_defaults=True):
    name: str
    arguments: Raw
    meta: RequestMeta | None = msgspec.field(default=None, name="_meta")


class CancelledParams(Struct, kw_only=True, omit_defaults=True):
    requestId: RequestId
    reason: str | None = None


# server -> client -------------------------------------------------------------------------


class ToolsCapability(Struct, kw_only=True):
    listChanged: bool = False


class ServerCapabilities(Struct, kw_only=True):
    tools: ToolsCapability | None = None
    resources: dict[str, Any] | None = None
    """``{subscribe?, listChanged?}`` when the server has resources."""
    prompts: dict[str, Any] | None = None
    completions: dict[str, Any] | None = None


class ListPage(Struct, kw_only=True):
    """One page of ``resources/list``, ``resources/templates/list`` or ``prompts/list``: the
    items as the server gave them (kept verbatim), and the next cursor."""

    resources: list[dict[str, Any]] | None = None
    resourceTemplates: list[dict[str, Any]] | None = None
    prompts: list[dict[str, Any]] | None = None
    nextCursor: str | None = None


class InitializeResult(Struct, kw_only=True):
    protocolVersion: str
    capabilities: ServerCapabilities = msgspec.field(default_factory=ServerCapabilities)
    serverInfo: Implementation = msgspec.field(default_factory=Implementation)
    instructions: str | None = None


class ResultMeta(Struct, kw_only=True):
    server_info: Implementation | None = msgspec.field(default=None, name=SERVER_INFO_KEY)


class DiscoverResult(Struct, kw_only=True):
    """A ``server/discover`` answer as the host (client) reads it."""

    supportedVersions: list[str]
    capabilities: ServerCapabilities = msgspec.field(default_factory=ServerCapabilities)
    instructions: str | None = None
    meta: ResultMeta | None = msgspec.field(default=None, name="_meta")


class UnsupportedVersionData(Struct, kw_only=True):
    """``error.data`` of :data:`UNSUPPORTED_VERSION`."""

    supported: list[str] = msgspec.field(default_factory=list)
    requested: str | None = None


class Tool(Struct, kw_only=True):
    name: str
    title: str | None = None
    description: str | None = None
    inputSchema: dict[str, Any] = msgspec.field(default_factory=lambda: {"type": "object"})
    outputSchema: dict[str, Any] | None = None
    annotations: dict[str, Any] | None = None


class ListToolsResult(Struct, kw_only=True):
    tools: list[Tool] = msgspec.field(default_factory=list)
    nextCursor: str | None = None


class ContentBlock(Struct, kw_only=True):
    """One block of a tool result; only ``text`` blocks become the model's text."""

    type: str = "text"
    text: str | None = None
    mimeType: str | None = None
    uri: str | None = None
    name: str | None = None


class CallToolResult(Struct, kw_only=True):
    content: list[Raw] = msgspec.field(default_factory=list)
    structuredContent: Raw | UnsetType = UNSET
    """UNSET when absent; may also be the raw ``null``."""
    isError: bool = False


class ProgressParams(Struct, kw_only=True):
    progressToken: RequestId
    progress: float = 0
    total: float | None = None
    message: str | None = None


class ProgressPayload(Struct, kw_only=True, omit_defaults=True):
    """What the host forwards as a ``tool.progress`` event for an MCP call."""

    progress: float
    total: float | None = None
    message: str | None = None


class LoggingParams(Struct, kw_only=True):
    level: str = "info"
    logger: str | None = None
    data: Any = None


# client -> server (what ``toolhost mcp`` reads) ---------------------------------------------


class InitializeRequestParams(Struct, kw_only=True):
    """``initialize`` params as a server reads them (tolerant: everything but the version)."""

    protocolVersion: str = ""
    capabilities: dict[str, Any] = msgspec.field(default_factory=dict)
    clientInfo: Implementation = msgspec.field(default_factory=Implementation)


class CallToolRequestParams(Struct, kw_only=True):
    """``tools/call`` params as a server reads them; ``arguments`` stays raw (``_meta`` carries
    the progress token, the trace and, in the stateless era, the envelope)."""

    name: str
    arguments: Raw = msgspec.field(default_factory=lambda: Raw(b"null"))
    meta: RequestMeta | None = msgspec.field(default=None, name="_meta")


class ServerToolsCapability(Struct, kw_only=True):
    listChanged: bool = True


class ServerCaps(Struct, kw_only=True):
    tools: ServerToolsCapability = msgspec.field(default_factory=ServerToolsCapability)
    resources: dict[str, Any] = msgspec.field(
        default_factory=lambda: {"subscribe": True, "listChanged": True}
    )
    prompts: dict[str, Any] = msgspec.field(default_factory=lambda: {"listChanged": True})
    completions: dict[str, Any] = msgspec.field(default_factory=dict)


class OfferRequestParams(Struct, kw_only=True):
    """Params of ``resources/*``, ``prompts/*``, ``completion/complete`` as the face reads them
    (the rest is passed on as it came); ``uri``/``name`` are checked against ``Mcp-Name``."""

    uri: str | None = None
    name: str | None = None
    meta: RequestMeta | None = msgspec.field(default=None, name="_meta")


class ServerInitializeResult(Struct, kw_only=True, omit_defaults=True):
    protocolVersion: str
    capabilities: ServerCaps
    serverInfo: Implementation
    instructions: str | None = None


class OutProgressParams(Struct, kw_only=True, omit_defaults=True):
    progressToken: RequestId
    progress: float
    total: float | None = None
    message: str | None = None


encoder = msgspec.json.Encoder()
incoming_decoder: msgspec.json.Decoder[Incoming] = msgspec.json.Decoder(Incoming)
