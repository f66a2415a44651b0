"""The server side of MCP as a sans-IO connection: what ``toolhost mcp`` speaks to a front-end.

# Strategy: the mirror of :class:`supervisor.protocols.mcp.McpConnection`, on the same contracts
# (``supervisor.contracts.mcp``) and the same line framing. The transport hands it bytes (stdio:
# any chunk, :meth:`McpServerConnection.feed`; Streamable HTTP: one POST body and its headers,
# :meth:`McpServerConnection.receive`) and gets typed events back. Both eras of MCP are spoken
# and the client's first request picks one, once: ``initialize`` is the handshake era (version
# negotiation, as before); ``server/discover``, or any request carrying the 2026-07-28 ``_meta``
# envelope, is the stateless era, where every request is checked on its own (the envelope, over
# HTTP the ``MCP-Protocol-Version``/``Mcp-Method``/``Mcp-Name`` headers against the body, the
# revision) and nothing depends on an earlier request. The lifecycle (``initialize``,
# ``server/discover``, ``ping``, errors for unknown methods or requests before either) is
# answered here as a :class:`Reply`; what needs the host comes out as :class:`ListTools`,
# :class:`CallTool`, :class:`Listen` and :class:`Cancelled`, and the transport answers with
# :meth:`result`, :meth:`tools_page`, :meth:`error`, :meth:`progress`, :meth:`listen_ack` and
# :meth:`tools_changed`, which give each era its shapes (stateless results carry
# ``resultType``, cache hints and the ``serverInfo`` stamp). Turning a kernel result envelope
# into a ``CallToolResult`` and a progress event into MCP progress is ``mcp_results.py``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Literal, TypeVar

import msgspec

from supervisor.contracts import mcp
from supervisor.protocols.errors import LineTooLong
from supervisor.protocols.framing import LineSplitter
from supervisor.protocols.mcp_http import decode_header_value

State = Literal["new", "ready"]
Era = Literal["handshake", "modern"]
_P = TypeVar("_P", mcp.ListToolsParams, mcp.ListenParams)

DEFAULT_MAX_LINE = 16 * 1024 * 1024

VERSION_HEADER = "mcp-protocol-version"
METHOD_HEADER = "mcp-method"
NAME_HEADER = "mcp-name"
"""Streamable HTTP routing headers of the stateless era (lowercase, as compared)."""
ROUTING_HEADERS = frozenset((VERSION_HEADER, METHOD_HEADER, NAME_HEADER))

LIST_TTL_MS = 0
"""``ttlMs`` of a stateless list answer: the list follows the host's catalog and each client's
profile, so a client should not reuse one (``subscriptions/listen`` says when it changed)."""

HTTP_STATUS = {
    mcp.PARSE_ERROR: 400,
    mcp.INVALID_REQUEST: 400,
    mcp.INVALID_PARAMS: 400,
    mcp.HEADER_MISMATCH: 400,
    mcp.UNSUPPORTED_VERSION: 400,
    mcp.METHOD_NOT_FOUND: 404,
}
"""The HTTP status of a JSON-RPC error in the stateless era (200 for any other code)."""

_encode = mcp.encoder.encode
_encode_into = mcp.encoder.encode_into

Line = bytes | bytearray
"""One newline-terminated message to write as it is."""


def _line(message: object) -> bytearray:
    """``message`` encoded with its newline, in one buffer: an answer carrying a 1 MiB resource
    is not copied once more to add the newline (-6 % of the serve's CPU per 1 MiB read in an
    A/B, bench/README.md, "A 1 MiB read scanned once")."""
    out = bytearray()
    _encode_into(message, out)
    out += b"\n"
    return out


_decode = mcp.incoming_decoder.decode


class Reply(msgspec.Struct, frozen=True, kw_only=True):
    """Bytes to send as they are (a lifecycle answer or an error); ``request`` is the id answered
    (None for a parse error), ``initialized`` is True on the ``initialize`` answer, ``code`` the
    JSON-RPC error code when the reply is an error."""

    data: Line
    request: mcp.RequestId | None = None
    initialized: bool = False
    code: int | None = None


class ListTools(msgspec.Struct, frozen=True, kw_only=True):
    """``tools/list``: answer with :meth:`McpServerConnection.tools_page` (the page ``cursor``
    starts)."""

    id: mcp.RequestId
    cursor: str | None = None


class CallTool(msgspec.Struct, frozen=True, kw_only=True):
    """``tools/call``: run ``name`` on ``arguments`` (raw JSON object, ``{}`` when absent)."""

    id: mcp.RequestId
    name: str
    arguments: msgspec.Raw
    progress_token: mcp.RequestId | None = None
    traceparent: str | None = None
    """W3C Trace Context from ``params._meta`` (the caller's trace)."""
    tracestate: str | None = None


class Listen(msgspec.Struct, frozen=True, kw_only=True):
    """``subscriptions/listen`` (stateless era): a stream of change notifications for what
    ``wanted`` names; answer with :meth:`McpServerConnection.listen_ack` first."""

    id: mcp.RequestId
    wanted: mcp.SubscriptionFilter


class Forward(msgspec.Struct, frozen=True, kw_only=True):
    """``resources/list``, ``resources/templates/list``, ``resources/read``, ``prompts/list``,
    ``prompts/get`` or ``completion/complete``: answered through the kernel method ``kernel``
    with ``params`` (the request's, ``_meta`` left out)."""

    id: mcp.RequestId
    method: str
    kernel: str
    params: dict[str, Any]


FORWARDED = {
    "resources/list": "resources.list",
    "resources/templates/list": "resources.templates",
    "resources/read": "resources.read",
    "prompts/list": "prompts.list",
    "prompts/get": "prompts.get",
    "completion/complete": "completion.complete",
    "resources/subscribe": "resources.subscribe",
    "resources/unsubscribe": "resources.unsubscribe",
}
"""The MCP methods served through a kernel method, and that method."""
HANDSHAKE_ONLY = frozenset(("resources/subscribe", "resources/unsubscribe"))
"""Forwarded methods the stateless era does not have (it subscribes on ``subscriptions/listen``)."""


class Cancelled(msgspec.Struct, frozen=True, kw_only=True):
    """``notifications/cancelled`` for the client's request ``id``."""

    id: mcp.RequestId
    reason: str | None = None


class Accepted(msgspec.Struct, frozen=True):
    """A notification or response that needs nothing (HTTP answers 202)."""


Event = Reply | ListTools | CallTool | Listen | Forward | Cancelled | Accepted

EMPTY_OBJECT = msgspec.Raw(b"{}")


def negotiate(requested: str) -> str:
    """The revision to answer: the client's when we speak it, else our newest."""
    return requested if requested in mcp.SERVER_VERSIONS else mcp.SERVER_VERSIONS[0]


class McpServerConnection:
    """One MCP client (a stdio pipe pair, one ``Mcp-Session-Id``, or one stateless HTTP request).

    Args:
        server_name: ``serverInfo.name``.
        server_version: ``serverInfo.version``.
        instructions: Optional ``instructions`` in the ``initialize``/``server/discover`` answer.
        max_line: Longest message accepted, in bytes.
        era: The era when the transport already knows it (an HTTP request that names a
            stateless revision in ``MCP-Protocol-Version``); None lets the first request decide.
    """

    def __init__(
        self,
        *,
        server_name: str = "toolhost",
        server_version: str = "0",
        instructions: str | None = None,
        max_line: int = DEFAULT_MAX_LINE,
        era: Era | None = None,
    ) -> None:
        self.state: State = "new" if era is None else "ready"
        self.era: Era | None = era
        self.protocol_version: str | None = None
        self.client: mcp.Implementation | None = None
        self._info = mcp.Implementation(name=server_name, version=server_version)
        self._stamp_info = {"name": server_name, "version": server_version}
        self._instructions = instructions
        self._lines = LineSplitter(max_line)
        self.max_line = max_line
        self.error_code: int | None = None
        """The code of the last error answer written (a stateless HTTP request has a
        connection of its own, so this is its answer's: the HTTP status follows it)."""

    # client -> server --------------------------------------------------------------------

    def feed(self, data: bytes) -> list[Event]:
        """Decode every complete line in ``data`` (stdio).

        Raises:
            LineTooLong: A line over the size limit (the stream cannot be resynchronised).
        """
        out: list[Event] = []
        for line in self._lines.feed(data):
            if line.strip():
                out.extend(self.receive(line))
        return out

    def receive(self, message: bytes, headers: Mapping[str, str] | None = None) -> list[Event]:
        """Decode one message (a line, or an HTTP body); a batch array gives one event each.

        ``headers`` (Streamable HTTP, names lowercase) are checked against the body in the
        stateless era. Never raises for bad input: malformed messages become error
        :class:`Reply` events.
        """
        if len(message) > self.max_line:
            raise LineTooLong(f"message over {self.max_line} bytes")
        body = message.lstrip()
        if body.startswith(b"["):
            try:
                items = msgspec.json.decode(body, type=list[msgspec.Raw])
            except (msgspec.DecodeError, RecursionError) as exc:  # nested too deeply
                return [self._parse_error(exc)]
            if not items:
                return [self._reply_error(None, mcp.INVALID_REQUEST, "empty batch")]
            return [self._one(bytes(item), headers) for item in items]
        return [self._one(body, headers)]

    def _one(self, raw: bytes, headers: Mapping[str, str] | None) -> Event:
        try:
            msg = _decode(raw)
        except (msgspec.DecodeError, RecursionError) as exc:  # nested too deeply
            return self._parse_error(exc)
        except msgspec.ValidationError as exc:
            return self._reply_error(None, mcp.INVALID_REQUEST, f"not a JSON-RPC message: {exc}")
        if msg.jsonrpc != "2.0":
            return self._reply_error(
                _id(msg.id), mcp.INVALID_REQUEST, f'jsonrpc must be "2.0", got {msg.jsonrpc!r}'
            )
        if msg.method is msgspec.UNSET:
            return Accepted()  # a response to a request we never send: nothing to do
        params = msg.params if msg.params is not msgspec.UNSET else None
        if msg.id is msgspec.UNSET:
            return self._notification(msg.method, params)
        if msg.id is None:
            return self._reply_error(None, mcp.INVALID_REQUEST, "request id must not be null")
        return self._request(msg.id, msg.method, params, headers)

    def _notification(self, method: str, params: msgspec.Raw | None) -> Event:
        if method == "notifications/cancelled" and params is not None:
            try:
                p = msgspec.json.decode(params, type=mcp.CancelledParams)
            except (msgspec.DecodeError, msgspec.ValidationError):
                return Accepted()  # a notification cannot be answered; ignore it
            return Cancelled(id=p.requestId, reason=p.reason)
        return Accepted()  # initialized, progress, roots/list_changed...: nothing to do

    def _request(
        self,
        rid: mcp.RequestId,
        method: str,
        params: msgspec.Raw | None,
        headers: Mapping[str, str] | None,
    ) -> Event:
        if method == "initialize":
            if self.era == "modern":
                return self._unsupported(rid, _requested(params))
            return self._initialize(rid, params)
        if method == "ping":
            return Reply(data=self.result(rid, {}), request=rid)
        if self.era is None:
            if method != "server/discover" and not _has_envelope(params):
                return self._reply_error(
                    rid, mcp.INVALID_REQUEST, f"{method} before initialize: send initialize first"
                )
            self.era, self.state = "modern", "ready"
        modern = self.era == "modern"
        if method == "tools/list":
            if modern:
                page = self._checked(rid, method, params, mcp.ListToolsParams, headers)
                if isinstance(page, Reply):
                    return page
                return ListTools(id=rid, cursor=page.cursor)
            return ListTools(id=rid, cursor=_cursor(params))
        if method == "tools/call":
            return self._call(rid, params, headers)
        if method == "server/discover":
            return self._discover(rid, params, headers)
        if method in FORWARDED and not (modern and method in HANDSHAKE_ONLY):
            return self._forward(rid, method, params, headers)
        if method == "subscriptions/listen" and modern:
            listen = self._checked(rid, method, params, mcp.ListenParams, headers)
            if isinstance(listen, Reply):
                return listen
            return Listen(id=rid, wanted=listen.notifications)
        return self._reply_error(
            rid, mcp.METHOD_NOT_FOUND, f"toolhost mcp does not serve {method!r}"
        )

    def _checked(
        self,
        rid: mcp.RequestId,
        method: str,
        params: msgspec.Raw | None,
        kind: type[_P],
        headers: Mapping[str, str] | None,
    ) -> _P | Reply:
        """A stateless request's params decoded as ``kind`` and its envelope checked, or the
        error to answer."""
        try:
            p = msgspec.json.decode(params or b"{}", type=kind)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            return self._reply_error(rid, mcp.INVALID_PARAMS, f"{method} params: {exc}")
        refused = self._envelope(rid, method, p.meta, None, headers)
        return p if refused is None else refused

    def _call(
        self, rid: mcp.RequestId, params: msgspec.Raw | None, headers: Mapping[str, str] | None
    ) -> Event:
        try:
            p = msgspec.json.decode(params or b"null", type=mcp.CallToolRequestParams)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            return self._reply_error(rid, mcp.INVALID_PARAMS, f"tools/call params: {exc}")
        meta = p.meta
        if self.era == "modern":
            refused = self._envelope(rid, "tools/call", meta, p.name, headers)
            if refused is not None:
                return refused
        args = p.arguments
        if bytes(args).strip() == b"null":
            args = EMPTY_OBJECT
        elif not bytes(args).lstrip().startswith(b"{"):
            return self._reply_error(
                rid, mcp.INVALID_PARAMS, "tools/call params.arguments: expected an object"
            )
        if meta is None:
            return CallTool(id=rid, name=p.name, arguments=args)
        return CallTool(
            id=rid,
            name=p.name,
            arguments=args,
            progress_token=meta.progressToken,
            traceparent=meta.traceparent,
            tracestate=meta.tracestate,
        )

    def _forward(
        self,
        rid: mcp.RequestId,
        method: str,
        params: msgspec.Raw | None,
        headers: Mapping[str, str] | None,
    ) -> Event:
        try:
            p = msgspec.json.decode(params or b"{}", type=mcp.OfferRequestParams)
            body = msgspec.json.decode(params or b"{}", type=dict[str, Any])
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            return self._reply_error(rid, mcp.INVALID_PARAMS, f"{method} params: {exc}")
        if self.era == "modern":
            name = p.uri if method == "resources/read" else p.name
            named = name if method in ("resources/read", "prompts/get") else None
            refused = self._envelope(rid, method, p.meta, named, headers)
            if refused is not None:
                return refused
        body.pop("_meta", None)
        return Forward(id=rid, method=method, kernel=FORWARDED[method], params=body)

    def _initialize(self, rid: mcp.RequestId, params: msgspec.Raw | None) -> Event:
        try:
            p = msgspec.json.decode(params or b"null", type=mcp.InitializeRequestParams)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            return self._reply_error(rid, mcp.INVALID_PARAMS, f"initialize params: {exc}")
        self.protocol_version = negotiate(p.protocolVersion)
        self.client = p.clientInfo
        self.state, self.era = "ready", "handshake"
        result = mcp.ServerInitializeResult(
            protocolVersion=self.protocol_version,
            capabilities=mcp.ServerCaps(),
            serverInfo=self._info,
            instructions=self._instructions,
        )
        return Reply(data=self.result(rid, result), request=rid, initialized=True)

    def _discover(
        self, rid: mcp.RequestId, params: msgspec.Raw | None, headers: Mapping[str, str] | None
    ) -> Event:
        """``server/discover``: the revisions and capabilities, answered in either era (it
        changes nothing). Its envelope is checked only when it has one: the probe of a client
        that does not know our revisions yet must still learn them."""
        try:
            p = msgspec.json.decode(params or b"{}", type=mcp.MetaParams)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            return self._reply_error(rid, mcp.INVALID_PARAMS, f"server/discover params: {exc}")
        meta = p.meta
        if meta is not None and meta.protocol_version is not msgspec.UNSET:
            refused = self._envelope(rid, "server/discover", meta, None, headers)
            if refused is not None:
                return refused
        result: dict[str, Any] = {
            "supportedVersions": list(mcp.MODERN_VERSIONS),
            "capabilities": mcp.ServerCaps(),
            "ttlMs": LIST_TTL_MS,
            "cacheScope": "public",
        }
        if self._instructions is not None:
            result["instructions"] = self._instructions
        return Reply(data=self._stamped(rid, result), request=rid)

    def _envelope(
        self,
        rid: mcp.RequestId,
        method: str,
        meta: mcp.RequestMeta | None,
        name: str | None,
        headers: Mapping[str, str] | None,
    ) -> Reply | None:
        """The stateless era's checks of one request, in the specification's order: the
        envelope is there, the HTTP headers agree with the body, the revision is ours. None
        when the request passes (``protocol_version`` and ``client`` are then its own)."""
        if meta is None or meta.protocol_version is msgspec.UNSET:
            return self._reply_error(
                rid,
                mcp.INVALID_PARAMS,
                f"params._meta must carry {mcp.PROTOCOL_VERSION_KEY!r} and "
                f"{mcp.CLIENT_CAPABILITIES_KEY!r} (the 2026-07-28 request envelope)",
            )
        if meta.client_capabilities is msgspec.UNSET:
            return self._reply_error(
                rid,
                mcp.INVALID_PARAMS,
                f"params._meta is missing {mcp.CLIENT_CAPABILITIES_KEY!r}",
            )
        version = meta.protocol_version
        if headers is not None:
            mismatch = header_mismatch(headers, method, version, name)
            if mismatch is not None:
                return self._reply_error(rid, mcp.HEADER_MISMATCH, mismatch)
        if not isinstance(version, str):
            return self._reply_error(
                rid, mcp.INVALID_PARAMS, f"{mcp.PROTOCOL_VERSION_KEY} must be a string"
            )
        if version not in mcp.MODERN_VERSIONS:
            return self._unsupported(rid, version)
        self.protocol_version = version
        info = meta.client_info
        if isinstance(info, dict):
            name_, version_ = info.get("name"), info.get("version")
            self.client = mcp.Implementation(
                name=name_ if isinstance(name_, str) else "",
                version=version_ if isinstance(version_, str) else "",
            )
        return None

    def _unsupported(self, rid: mcp.RequestId, requested: str) -> Reply:
        data = {"supported": list(mcp.MODERN_VERSIONS), "requested": requested}
        message = (
            "this connection speaks the 2026-07-28 revision (no initialize handshake)"
            if self.era == "modern" and requested in mcp.SERVER_VERSIONS
            else f"unsupported protocol version {requested!r}"
        )
        info = mcp.RpcErrorInfo(code=mcp.UNSUPPORTED_VERSION, message=message, data=data)
        line = _encode(mcp.OutError(id=rid, error=info)) + b"\n"
        return Reply(data=line, request=rid, code=mcp.UNSUPPORTED_VERSION)

    def _parse_error(self, exc: Exception) -> Reply:
        return self._reply_error(None, mcp.PARSE_ERROR, f"not JSON: {exc}")

    def _reply_error(self, rid: mcp.RequestId | None, code: int, message: str) -> Reply:
        return Reply(data=self.error(rid, code, message), request=rid, code=code)

    # server -> client --------------------------------------------------------------------

    def result(self, rid: mcp.RequestId, result: Any) -> Line:
        """A response line (newline-terminated); in the stateless era an object result gets
        ``resultType`` and the ``serverInfo`` stamp."""
        if self.era == "modern" and isinstance(result, dict):
            return self._stamped(rid, result)
        return _line(mcp.OutResult(id=rid, result=result))

    def tools_page(self, rid: mcp.RequestId, tools: list[Any], cursor: str | None = None) -> Line:
        """The ``tools/list`` answer (``cursor``: its ``nextCursor``); stateless: with its cache
        hints."""
        return self.page(rid, "tools", tools, cursor)

    def page(
        self, rid: mcp.RequestId, key: str, items: list[Any], cursor: str | None = None
    ) -> Line:
        """A list answer (``key`` naming its items, ``cursor`` its ``nextCursor`` when more
        follow); stateless: with its cache hints."""
        page: dict[str, Any] = {key: items}
        if cursor is not None:
            page["nextCursor"] = cursor
        if self.era == "modern":
            return self._stamped(rid, {**page, "ttlMs": LIST_TTL_MS, "cacheScope": "private"})
        return self.result(rid, page)

    def _stamped(self, rid: mcp.RequestId, result: dict[str, Any]) -> Line:
        out = dict(result)
        out.setdefault("resultType", "complete")
        meta = out.get("_meta")
        meta = dict(meta) if isinstance(meta, dict) else {}
        meta.setdefault(mcp.SERVER_INFO_KEY, self._stamp_info)
        out["_meta"] = meta
        return _line(mcp.OutResult(id=rid, result=out))

    def error(self, rid: mcp.RequestId | None, code: int, message: str, data: Any = None) -> bytes:
        """An error response line."""
        self.error_code = code
        info = mcp.RpcErrorInfo(code=code, message=message, data=data)
        return _encode(mcp.OutError(id=rid, error=info)) + b"\n"

    def progress(
        self,
        token: mcp.RequestId,
        progress: float,
        total: float | None = None,
        message: str | None = None,
    ) -> bytes:
        """A ``notifications/progress`` line."""
        params = mcp.OutProgressParams(
            progressToken=token, progress=progress, total=total, message=message
        )
        return _encode(mcp.OutNotification(method="notifications/progress", params=params)) + b"\n"

    def listen_ack(self, rid: mcp.RequestId, honored: mcp.SubscriptionFilter) -> bytes:
        """The first frame of a ``subscriptions/listen`` stream: what it will carry."""
        params = {"notifications": honored, "_meta": {mcp.SUBSCRIPTION_ID_KEY: rid}}
        note = mcp.OutNotification(method="notifications/subscriptions/acknowledged", params=params)
        return _encode(note) + b"\n"

    def tools_changed(self, subscription: mcp.RequestId | None = None) -> bytes:
        """A ``notifications/tools/list_changed`` line; on a listen stream (stateless era) it
        names the ``subscription`` (the listen request's id)."""
        return self.list_changed("tools", subscription)

    def list_changed(self, kind: str, subscription: mcp.RequestId | None = None) -> bytes:
        """``notifications/{kind}/list_changed`` (``tools``, ``resources``, ``prompts``), tagged
        with the listen request's id on a listen stream."""
        return self._note(f"notifications/{kind}/list_changed", {}, subscription)

    def resource_updated(self, uri: str, subscription: mcp.RequestId | None = None) -> bytes:
        """``notifications/resources/updated`` for ``uri`` (tagged on a listen stream)."""
        return self._note("notifications/resources/updated", {"uri": uri}, subscription)

    def _note(
        self, method: str, params: dict[str, Any], subscription: mcp.RequestId | None
    ) -> bytes:
        if subscription is not None:
            params = {**params, "_meta": {mcp.SUBSCRIPTION_ID_KEY: subscription}}
        note = mcp.OutNotification(method=method, params=params or msgspec.UNSET)
        return _encode(note) + b"\n"


def honored(wanted: mcp.SubscriptionFilter) -> mcp.SubscriptionFilter:
    """What a listen stream will carry of what it asked for (list changes of tools, resources
    and prompts, updates of the resources named; what we never send is left out of the
    acknowledgement, as the specification asks)."""
    return mcp.SubscriptionFilter(
        toolsListChanged=True if wanted.toolsListChanged else None,
        resourcesListChanged=True if wanted.resourcesListChanged else None,
        promptsListChanged=True if wanted.promptsListChanged else None,
        resourceSubscriptions=list(wanted.resourceSubscriptions or []) or None,
    )


def wants(shown: mcp.SubscriptionFilter, kind: str) -> bool:
    """Whether a listen stream that was acknowledged ``shown`` carries ``kind``'s list changes."""
    return bool(getattr(shown, f"{kind}ListChanged", None))


def header_mismatch(
    headers: Mapping[str, str], method: str, version: Any, name: str | None
) -> str | None:
    """Why the stateless-era HTTP headers disagree with the body (None when they agree):
    ``MCP-Protocol-Version`` is the envelope's revision, ``Mcp-Method`` the method and, for
    ``tools/call``, ``Mcp-Name`` the tool (base64-wrapped values decoded)."""
    if headers.get(VERSION_HEADER) != version:
        return "the MCP-Protocol-Version header does not match params._meta's protocol version"
    if headers.get(METHOD_HEADER) != method:
        return f"the Mcp-Method header does not match the body's method {method!r}"
    if name is not None and decode_header_value(headers.get(NAME_HEADER)) != name:
        return "the Mcp-Name header does not match the body's name"
    return None


def duplicated_routing_header(raw: Iterable[tuple[bytes, bytes]]) -> str | None:
    """A routing header given twice (first-copy and last-copy readers would disagree)."""
    seen: set[str] = set()
    for name, _ in raw:
        key = name.decode("latin-1").lower()
        if key in ROUTING_HEADERS:
            if key in seen:
                return key
            seen.add(key)
    return None


def _has_envelope(params: msgspec.Raw | None) -> bool:
    """True when the request carries the stateless era's ``_meta`` protocol version."""
    if params is None:
        return False
    try:
        p = msgspec.json.decode(params, type=mcp.MetaParams)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return False
    return p.meta is not None and p.meta.protocol_version is not msgspec.UNSET


def _cursor(params: msgspec.Raw | None) -> str | None:
    """A handshake-era list request's ``cursor`` (None when absent or unreadable)."""
    try:
        return msgspec.json.decode(params or b"{}", type=mcp.ListToolsParams).cursor
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None


def _requested(params: msgspec.Raw | None) -> str:
    try:
        return msgspec.json.decode(
            params or b"{}", type=mcp.InitializeRequestParams
        ).protocolVersion
    except (msgspec.DecodeError, msgspec.ValidationError):
        return ""


def _id(value: mcp.RequestId | msgspec.UnsetType | None) -> mcp.RequestId | None:
    return value if isinstance(value, int | str) else None
