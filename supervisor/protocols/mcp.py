"""The client side of an MCP stdio server as a sans-IO connection (PROTOCOL 3.4).

# Strategy: one object per server process. The runtime asks it for the bytes of every request
# or notification (``initialize``, ``tools/list``, ``tools/call``, ``ping``, cancellation) and
# gets back the request id to wait on; it hands it every chunk read from the server's stdout and
# gets typed events: a :class:`Response` tied to the request it answers, :class:`Progress` for a
# call that asked for it, :class:`ToolsChanged`, :class:`Log`, and :class:`Reply` (bytes the
# host must write back, for requests the *server* sends, e.g. ``ping``). Request ids are
# integers issued here and never reused, so an answer to an issued id that is no longer pending
# (a call the host cancelled: servers should not answer those, some do) is dropped quietly,
# while an answer to an id never issued, a line that is not JSON-RPC, or a message before the
# handshake is a :class:`ProtocolError` that leaves the connection in the error state.
# Turning results into host terms (:func:`call_answer`, :func:`tools_page`) is pure as well.
"""

from __future__ import annotations

from typing import Literal

import msgspec

from supervisor.contracts import mcp
from supervisor.contracts.wire import ToolInfo
from supervisor.protocols.errors import ProtocolError
from supervisor.protocols.framing import LineSplitter
from supervisor.protocols.outcome import CallOutcome, preview

State = Literal["new", "initializing", "ready", "error"]

DEFAULT_MAX_LINE = 16 * 1024 * 1024

_encode = mcp.encoder.encode
_decode = mcp.incoming_decoder.decode
_decode_batch = msgspec.json.Decoder(list[mcp.Incoming]).decode
_decode_block = msgspec.json.Decoder(mcp.ContentBlock).decode


class Response(msgspec.Struct, frozen=True, kw_only=True):
    """The server answered request ``id`` (whose method was ``method``)."""

    id: int
    method: str
    result: msgspec.Raw | None = None
    error: mcp.RpcErrorInfo | None = None


class Progress(msgspec.Struct, frozen=True, kw_only=True):
    """``notifications/progress`` for the call with request id ``id``."""

    id: int
    payload: msgspec.Raw


class ToolsChanged(msgspec.Struct, frozen=True):
    """``notifications/tools/list_changed``: list the tools again."""


class Log(msgspec.Struct, frozen=True, kw_only=True):
    """A log notification (``notifications/message``), as one line of text."""

    text: str


class Reply(msgspec.Struct, frozen=True, kw_only=True):
    """Bytes to write back: the answer to a request the server sent."""

    data: bytes


Event = Response | Progress | ToolsChanged | Log | Reply


class RequestFailed(Exception):
    """The server answered a lifecycle request with a JSON-RPC error."""

    def __init__(self, method: str, error: mcp.RpcErrorInfo) -> None:
        super().__init__(f"{method} failed: {error.message} (code {error.code})")
        self.method = method
        self.error = error


class McpConnection:
    """The host (client) side of one MCP server (stdio, or Streamable HTTP answers fed as lines).

    Args:
        max_line: Longest line accepted from the server, in bytes.
        client_name: ``clientInfo.name`` sent in ``initialize``.
        client_version: ``clientInfo.version``.
        channel: Where the server's messages arrive, as error messages say it.
    """

    def __init__(
        self,
        *,
        max_line: int = DEFAULT_MAX_LINE,
        client_name: str = "toolhost",
        client_version: str = "0",
        channel: str = "on stdout",
    ) -> None:
        self.state: State = "new"
        self.channel = channel
        self.error: str | None = None
        self.server: mcp.InitializeResult | None = None
        self._client = mcp.Implementation(name=client_name, version=client_version)
        self._lines = LineSplitter(max_line)
        self._next_id = 1
        self.pending: dict[int, str] = {}
        self._progress: set[int] = set()

    @property
    def protocol_version(self) -> str | None:
        """The revision the server chose (None before the handshake)."""
        return self.server.protocolVersion if self.server else None

    # host -> server ----------------------------------------------------------------------

    def _request(self, method: str, params: object = msgspec.UNSET) -> tuple[int, bytes]:
        rid = self._next_id
        self._next_id += 1
        self.pending[rid] = method
        return rid, _encode(mcp.OutRequest(id=rid, method=method, params=params)) + b"\n"

    def initialize(self) -> tuple[int, bytes]:
        """The first request: ``initialize`` asking for :data:`mcp.PROTOCOL_VERSION`."""
        if self.state != "new":
            raise ProtocolError(f"cannot initialize in state {self.state}")
        self.state = "initializing"
        params = mcp.InitializeParams(
            protocolVersion=mcp.PROTOCOL_VERSION, capabilities={}, clientInfo=self._client
        )
        return self._request("initialize", params)

    def initialized(self, response: Response) -> bytes:
        """Accept the ``initialize`` answer; returns the ``notifications/initialized`` line.

        Raises:
            RequestFailed: The server refused to initialize.
            ProtocolError: The answer is not an InitializeResult.
        """
        if response.error is not None:
            raise RequestFailed("initialize", response.error)
        try:
            self.server = msgspec.json.decode(response.result or b"null", type=mcp.InitializeResult)
        except (msgspec.ValidationError, msgspec.DecodeError) as exc:
            self._fail(f"invalid initialize result: {exc}")
        self.state = "ready"
        return _encode(mcp.OutNotification(method="notifications/initialized")) + b"\n"

    def list_tools(self, cursor: str | None = None) -> tuple[int, bytes]:
        """A ``tools/list`` request (one page; pass the previous ``nextCursor``)."""
        self._need_ready("tools/list")
        return self._request("tools/list", mcp.ListToolsParams(cursor=cursor))

    def call_tool(
        self,
        name: str,
        arguments: msgspec.Raw,
        *,
        progress: bool = False,
        traceparent: str | None = None,
    ) -> tuple[int, bytes]:
        """A ``tools/call`` request; with ``progress`` its id doubles as the progress token;
        ``traceparent`` goes in ``params._meta`` (the MCP client span's, when tracing)."""
        self._need_ready("tools/call")
        rid = self._next_id
        meta = None
        if progress or traceparent is not None:
            meta = mcp.RequestMeta(progressToken=rid if progress else None, traceparent=traceparent)
        if progress:
            self._progress.add(rid)
        return self._request(
            "tools/call", mcp.CallToolParams(name=name, arguments=arguments, meta=meta)
        )

    def ping(self) -> tuple[int, bytes]:
        """A ``ping`` request (allowed before the handshake completes)."""
        return self._request("ping")

    def cancel(self, rid: int, reason: str) -> bytes:
        """Stop waiting for request ``rid``; returns the ``notifications/cancelled`` line.

        Returns ``b""`` when ``rid`` is no longer pending (answered meanwhile). A later answer for
        it is dropped by :meth:`feed`.
        """
        self._progress.discard(rid)
        if self.pending.pop(rid, None) is None:
            return b""
        params = mcp.CancelledParams(requestId=rid, reason=reason)
        return _encode(mcp.OutNotification(method="notifications/cancelled", params=params)) + b"\n"

    # server -> host ----------------------------------------------------------------------

    def feed(self, data: bytes) -> list[Event]:
        """Decode every complete line in ``data`` into events.

        Raises:
            ProtocolError: On the first breach (``accepted`` holds the events before it); the
                connection stays in the error state.
        """
        if self.state == "error":
            raise ProtocolError(self.error or "connection in error state")
        out: list[Event] = []
        try:
            for line in self._lines.feed(data):
                if not line.strip():
                    continue
                for msg in self._decode(line):
                    event = self._accept(msg)
                    if event is not None:
                        out.append(event)
            return out
        except ProtocolError as exc:
            self.state = "error"
            self.error = exc.message
            exc.accepted = out
            raise

    def _decode(self, line: bytes) -> list[mcp.Incoming]:
        try:
            if line.lstrip().startswith(b"["):
                return _decode_batch(line)
            return [_decode(line)]
        except (msgspec.DecodeError, msgspec.ValidationError, RecursionError) as exc:
            raise ProtocolError(
                f"not a JSON-RPC message {self.channel}: {exc}: {preview(line)}"
            ) from exc

    def _accept(self, msg: mcp.Incoming) -> Event | None:
        if msg.jsonrpc != "2.0":
            raise ProtocolError(f'jsonrpc must be "2.0", got {msg.jsonrpc!r}')
        if msg.method is not msgspec.UNSET:
            if msg.id is msgspec.UNSET:
                return self._notification(msg.method, msg.params)
            return self._server_request(msg.id, msg.method)
        if msg.result is msgspec.UNSET and msg.error is msgspec.UNSET:
            raise ProtocolError("a JSON-RPC message with neither method, result nor error")
        error = None if msg.error is msgspec.UNSET else msg.error
        if msg.id is None or msg.id is msgspec.UNSET:
            message = error.message if error is not None else "a result"
            raise ProtocolError(f"server sent an error without a request id: {message}")
        rid = msg.id
        if not isinstance(rid, int) or not 0 < rid < self._next_id:
            raise ProtocolError(f"answer for unknown request {rid!r}")
        method = self.pending.pop(rid, None)
        self._progress.discard(rid)
        if method is None:
            return None  # a request the host cancelled, answered anyway
        result = None if msg.result is msgspec.UNSET else msg.result
        if self.state == "initializing" and method not in ("initialize", "ping"):
            raise ProtocolError(f"answer to {method} before initialize completed")
        return Response(id=rid, method=method, result=result, error=error)

    def _notification(self, method: str, params: msgspec.Raw | msgspec.UnsetType) -> Event | None:
        if method == "notifications/progress":
            try:
                p = msgspec.json.decode(
                    params if params is not msgspec.UNSET else b"null", type=mcp.ProgressParams
                )
            except (msgspec.ValidationError, msgspec.DecodeError) as exc:
                raise ProtocolError(f"invalid progress notification: {exc}") from exc
            token = p.progressToken
            if isinstance(token, int) and token in self._progress:
                payload = mcp.ProgressPayload(progress=p.progress, total=p.total, message=p.message)
                return Progress(id=token, payload=msgspec.Raw(_encode(payload)))
            return None  # late progress for a finished call
        if method == "notifications/tools/list_changed":
            return ToolsChanged() if self.state == "ready" else None
        if method == "notifications/message":
            try:
                log = msgspec.json.decode(
                    params if params is not msgspec.UNSET else b"{}", type=mcp.LoggingParams
                )
            except (msgspec.ValidationError, msgspec.DecodeError):
                return None
            data = log.data if isinstance(log.data, str) else _encode(log.data).decode()
            where = f" {log.logger}" if log.logger else ""
            return Log(text=f"[{log.level}{where}] {data}")
        return None  # other notifications (resources, prompts, cancelled) mean nothing here

    def _server_request(self, rid: mcp.RequestId | msgspec.UnsetType | None, method: str) -> Reply:
        if rid is None or rid is msgspec.UNSET:
            raise ProtocolError(f"server request {method} without an id")
        if method == "ping":
            return Reply(data=_encode(mcp.OutResult(id=rid, result={})) + b"\n")
        error = mcp.RpcErrorInfo(
            code=mcp.METHOD_NOT_FOUND, message=f"toolhost does not support {method}"
        )
        return Reply(data=_encode(mcp.OutError(id=rid, error=error)) + b"\n")

    def _need_ready(self, what: str) -> None:
        if self.state != "ready":
            raise ProtocolError(f"cannot send {what} in state {self.state}")

    def _fail(self, message: str) -> None:
        self.state = "error"
        self.error = message
        raise ProtocolError(message)


# results in host terms ----------------------------------------------------------------------


def tools_page(response: Response) -> tuple[list[ToolInfo], str | None]:
    """The tools of one ``tools/list`` page (as the host's ToolInfo) and the next cursor.

    Raises:
        RequestFailed: The server answered with an error.
        ProtocolError: The result is not a ListToolsResult.
    """
    if response.error is not None:
        raise RequestFailed("tools/list", response.error)
    try:
        page = msgspec.json.decode(response.result or b"null", type=mcp.ListToolsResult)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise ProtocolError(f"invalid tools/list result: {exc}") from exc
    tools = [
        ToolInfo(
            name=t.name,
            description=t.description or t.title or "",
            inputSchema=t.inputSchema,
            outputSchema=t.outputSchema,
            annotations=t.annotations,
        )
        for t in page.tools
    ]
    return tools, page.nextCursor or None


_RPC_CODES = {mcp.INVALID_PARAMS: "invalid-input", mcp.METHOD_NOT_FOUND: "unsupported"}


def call_answer(response: Response) -> CallOutcome:
    """A ``tools/call`` answer in host terms.

    ``structuredContent`` (else the content blocks) is the data; text blocks joined are the
    model's text (other blocks appear as short markers); ``isError: true`` is ``failed`` with the
    data kept; a JSON-RPC error is ``invalid-input`` (-32602), ``unsupported`` (-32601) or
    ``failed``, with the JSON-RPC code in ``details``.
    """
    if response.error is not None:
        err = response.error
        details: dict[str, object] = {"rpcCode": err.code}
        if err.data is not None:
            details["rpcData"] = err.data
        return CallOutcome(
            ok=False,
            code=_RPC_CODES.get(err.code, "failed"),
            error=err.message or f"tools/call failed (code {err.code})",
            details=details,
        )
    try:
        result = msgspec.json.decode(response.result or b"null", type=mcp.CallToolResult)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        return CallOutcome(
            ok=False, code="protocol-error", error=f"invalid tools/call result: {exc}"
        )
    texts: list[str] = []
    for raw in result.content:
        try:
            block = _decode_block(raw)
        except (msgspec.ValidationError, msgspec.DecodeError):
            continue
        if block.type == "text" and block.text is not None:
            texts.append(block.text)
        elif block.type in ("image", "audio"):
            texts.append(f"[{block.type} content{': ' + block.mimeType if block.mimeType else ''}]")
        elif block.type in ("resource", "resource_link"):
            texts.append(f"[{block.type}: {block.uri or block.name or '?'}]")
    structured = result.structuredContent
    if structured is not msgspec.UNSET and bytes(structured).strip() != b"null":
        data = structured
    elif result.content:
        data = msgspec.Raw(_encode(result.content))
    else:
        data = msgspec.Raw(b"null")
    content = "\n".join(texts) if texts else None
    if result.isError:
        return CallOutcome(
            ok=False,
            code="failed",
            error=content or "the MCP tool reported an error",
            data=data,
        )
    return CallOutcome(ok=True, data=data, content=content)
