"""The server side of MCP as a sans-IO connection: what ``toolhost mcp`` speaks to a front-end.

# Strategy: the mirror of :class:`supervisor.protocols.mcp.McpConnection`, on the same contracts
# (``supervisor.contracts.mcp``) and the same line framing. The transport hands it bytes (stdio:
# any chunk, :meth:`McpServerConnection.feed`; Streamable HTTP: one POST body,
# :meth:`McpServerConnection.receive`) and gets typed events back. The lifecycle (``initialize``
# with version negotiation, ``ping``, errors for unknown methods or requests before the
# handshake) is answered here as a :class:`Reply`; what needs the host comes out as
# :class:`ListTools`, :class:`CallTool` and :class:`Cancelled`, and the transport answers with
# :meth:`result`, :meth:`error`, :meth:`progress` and :meth:`tools_changed`. Turning a kernel
# result envelope into a ``CallToolResult`` (:func:`call_result`) and a progress event into MCP
# progress (:func:`progress_fields`) is pure as well.
"""

from __future__ import annotations

import json
from typing import Any, Literal

import msgspec

from supervisor.contracts import mcp
from supervisor.protocols.errors import LineTooLong
from supervisor.protocols.framing import LineSplitter

State = Literal["new", "ready"]

DEFAULT_MAX_LINE = 16 * 1024 * 1024

_encode = mcp.encoder.encode
_decode = mcp.incoming_decoder.decode


class Reply(msgspec.Struct, frozen=True, kw_only=True):
    """Bytes to send as they are (a lifecycle answer or an error); ``request`` is the id answered
    (None for a parse error), ``initialized`` is True on the ``initialize`` answer."""

    data: bytes
    request: mcp.RequestId | None = None
    initialized: bool = False


class ListTools(msgspec.Struct, frozen=True, kw_only=True):
    """``tools/list``: answer with :meth:`McpServerConnection.result` (one page, no cursor)."""

    id: mcp.RequestId


class CallTool(msgspec.Struct, frozen=True, kw_only=True):
    """``tools/call``: run ``name`` on ``arguments`` (raw JSON object, ``{}`` when absent)."""

    id: mcp.RequestId
    name: str
    arguments: msgspec.Raw
    progress_token: mcp.RequestId | None = None
    traceparent: str | None = None
    """W3C Trace Context from ``params._meta`` (the caller's trace)."""
    tracestate: str | None = None


class Cancelled(msgspec.Struct, frozen=True, kw_only=True):
    """``notifications/cancelled`` for the client's request ``id``."""

    id: mcp.RequestId
    reason: str | None = None


class Accepted(msgspec.Struct, frozen=True):
    """A notification or response that needs nothing (HTTP answers 202)."""


Event = Reply | ListTools | CallTool | Cancelled | Accepted

EMPTY_OBJECT = msgspec.Raw(b"{}")


def negotiate(requested: str) -> str:
    """The revision to answer: the client's when we speak it, else our newest."""
    return requested if requested in mcp.SERVER_VERSIONS else mcp.SERVER_VERSIONS[0]


class McpServerConnection:
    """One MCP client session (a stdio pipe pair, or one ``Mcp-Session-Id``).

    Args:
        server_name: ``serverInfo.name``.
        server_version: ``serverInfo.version``.
        instructions: Optional ``instructions`` in the ``initialize`` answer.
        max_line: Longest message accepted, in bytes.
    """

    def __init__(
        self,
        *,
        server_name: str = "toolhost",
        server_version: str = "0",
        instructions: str | None = None,
        max_line: int = DEFAULT_MAX_LINE,
    ) -> None:
        self.state: State = "new"
        self.protocol_version: str | None = None
        self.client: mcp.Implementation | None = None
        self._info = mcp.Implementation(name=server_name, version=server_version)
        self._instructions = instructions
        self._lines = LineSplitter(max_line)
        self.max_line = max_line

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

    def receive(self, message: bytes) -> list[Event]:
        """Decode one message (a line, or an HTTP body); a batch array gives one event each.

        Never raises for bad input: malformed messages become error :class:`Reply` events.
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
            return [self._one(bytes(item)) for item in items]
        return [self._one(body)]

    def _one(self, raw: bytes) -> Event:
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
        return self._request(msg.id, msg.method, params)

    def _notification(self, method: str, params: msgspec.Raw | None) -> Event:
        if method == "notifications/cancelled" and params is not None:
            try:
                p = msgspec.json.decode(params, type=mcp.CancelledParams)
            except (msgspec.DecodeError, msgspec.ValidationError):
                return Accepted()  # a notification cannot be answered; ignore it
            return Cancelled(id=p.requestId, reason=p.reason)
        return Accepted()  # initialized, progress, roots/list_changed...: nothing to do

    def _request(self, rid: mcp.RequestId, method: str, params: msgspec.Raw | None) -> Event:
        if method == "initialize":
            return self._initialize(rid, params)
        if method == "ping":
            return Reply(data=self.result(rid, {}), request=rid)
        if self.state != "ready":
            return self._reply_error(
                rid, mcp.INVALID_REQUEST, f"{method} before initialize: send initialize first"
            )
        if method == "tools/list":
            return ListTools(id=rid)
        if method == "tools/call":
            try:
                p = msgspec.json.decode(params or b"null", type=mcp.CallToolRequestParams)
            except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                return self._reply_error(rid, mcp.INVALID_PARAMS, f"tools/call params: {exc}")
            args = p.arguments
            if bytes(args).strip() == b"null":
                args = EMPTY_OBJECT
            elif not bytes(args).lstrip().startswith(b"{"):
                return self._reply_error(
                    rid, mcp.INVALID_PARAMS, "tools/call params.arguments: expected an object"
                )
            meta = p.meta
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
        return self._reply_error(
            rid, mcp.METHOD_NOT_FOUND, f"toolhost mcp does not serve {method!r} (tools only)"
        )

    def _initialize(self, rid: mcp.RequestId, params: msgspec.Raw | None) -> Event:
        try:
            p = msgspec.json.decode(params or b"null", type=mcp.InitializeRequestParams)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            return self._reply_error(rid, mcp.INVALID_PARAMS, f"initialize params: {exc}")
        self.protocol_version = negotiate(p.protocolVersion)
        self.client = p.clientInfo
        self.state = "ready"
        result = mcp.ServerInitializeResult(
            protocolVersion=self.protocol_version,
            capabilities=mcp.ServerCaps(),
            serverInfo=self._info,
            instructions=self._instructions,
        )
        return Reply(data=self.result(rid, result), request=rid, initialized=True)

    def _parse_error(self, exc: Exception) -> Reply:
        return self._reply_error(None, mcp.PARSE_ERROR, f"not JSON: {exc}")

    def _reply_error(self, rid: mcp.RequestId | None, code: int, message: str) -> Reply:
        return Reply(data=self.error(rid, code, message), request=rid)

    # server -> client --------------------------------------------------------------------

    def result(self, rid: mcp.RequestId, result: Any) -> bytes:
        """A response line (newline-terminated)."""
        return _encode(mcp.OutResult(id=rid, result=result)) + b"\n"

    def error(self, rid: mcp.RequestId | None, code: int, message: str, data: Any = None) -> bytes:
        """An error response line."""
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

    def tools_changed(self) -> bytes:
        """A ``notifications/tools/list_changed`` line."""
        return _encode(mcp.OutNotification(method="notifications/tools/list_changed")) + b"\n"


def _id(value: mcp.RequestId | msgspec.UnsetType | None) -> mcp.RequestId | None:
    return value if isinstance(value, int | str) else None


# kernel terms -> MCP terms ----------------------------------------------------------------


def progress_fields(data: Any, seq: int) -> tuple[float, float | None, str | None]:
    """MCP ``(progress, total, message)`` for the ``seq``-th ``tool.progress`` event of a call.

    A payload that already has a numeric ``progress`` (an MCP sidecar's) keeps its numbers;
    anything else counts events (``progress`` = ``seq``) and travels as JSON text in ``message``.
    """
    if isinstance(data, dict):
        value = data.get("progress")
        if isinstance(value, int | float) and not isinstance(value, bool):
            total = data.get("total")
            message = data.get("message")
            return (
                float(value),
                float(total) if isinstance(total, int | float) else None,
                message if isinstance(message, str) else None,
            )
    text = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    return float(seq), None, text


def call_result(envelope: dict[str, Any]) -> dict[str, Any]:
    """A kernel result envelope (PROTOCOL 5) as an MCP ``CallToolResult``.

    Success: a text block with ``content`` and ``structuredContent`` = ``data`` when it is an
    object (``{"result": data}`` otherwise, as MCP wants an object). Failure or unavailable:
    ``isError: true``, the text ``[code] message`` and ``structuredContent`` ``{status, error}``
    so the caller keeps our code. ``_meta.toolhost`` carries the envelope's ``meta``.
    """
    status = envelope.get("status")
    content = envelope.get("content") or ""
    meta = envelope.get("meta") or {}
    out: dict[str, Any] = {}
    if status == "success":
        data = envelope.get("data")
        out["content"] = [{"type": "text", "text": content}]
        if isinstance(data, dict):
            out["structuredContent"] = data
        elif data is not None:
            out["structuredContent"] = {"result": data}
        out["isError"] = False
    else:
        error = envelope.get("error") or {}
        code = error.get("code") or status or "failed"
        message = error.get("message") or content
        out["content"] = [{"type": "text", "text": f"[{code}] {message}"}]
        structured: dict[str, Any] = {"status": status, "error": error}
        if envelope.get("data") is not None:
            structured["data"] = envelope["data"]
        out["structuredContent"] = structured
        out["isError"] = True
    out["_meta"] = {"toolhost": {"status": status, **meta}}
    return out
