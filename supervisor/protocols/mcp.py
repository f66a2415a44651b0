"""The client side of an MCP stdio server as a sans-IO connection (PROTOCOL 3.4).

# Strategy: one object per server process. The runtime asks it for the bytes of every request
# or notification (``server/discover`` or ``initialize``, ``tools/list``, ``tools/call``,
# ``ping``, cancellation) and gets back the request id to wait on. Both eras: the host first
# sends ``server/discover`` (:meth:`McpConnection.discover`); a modern answer makes the
# connection ready in the stateless era (every later request carries the ``_meta`` envelope,
# ``server/discover`` is the probe, ``subscriptions/listen`` brings list changes, over HTTP
# :meth:`McpConnection.http_headers` are the routing headers); anything else (an error, a
# non-modern answer, or no answer in time: :meth:`McpConnection.abandon_discover`) leaves it
# ``new`` for the handshake, as before. The runtime hands it every chunk read from the server's
# stdout and gets typed events: a :class:`Response` tied to the request it answers,
# :class:`Progress` for a call that asked for it, :class:`ToolsChanged`, :class:`Log`, and
# :class:`Reply` (bytes the host must write back, for requests the *server* sends, e.g.
# ``ping``). Request ids are integers issued here and never reused, so an answer to an issued
# id that is no longer pending (a call the host cancelled: servers should not answer those, some
# do) is dropped quietly, while an answer to an id never issued, a line that is not JSON-RPC, or
# a message before the handshake is a :class:`ProtocolError` that leaves the connection in the
# error state. Turning results into host terms (:func:`call_answer`, :func:`tools_page`) is pure
# as well.
"""

from __future__ import annotations

from typing import Literal

import msgspec

from supervisor.contracts import mcp
from supervisor.contracts.wire import ToolInfo
from supervisor.protocols.errors import ProtocolError
from supervisor.protocols.framing import LineSplitter
from supervisor.protocols.mcp_http import encode_header_value
from supervisor.protocols.outcome import CallOutcome, preview

State = Literal["new", "discovering", "initializing", "ready", "error"]
Era = Literal["handshake", "modern"]

DEFAULT_MAX_LINE = 16 * 1024 * 1024

_encode = mcp.encoder.encode
_decode = mcp.incoming_decoder.decode
_decode_batch = msgspec.json.Decoder(list[mcp.Incoming]).decode
_decode_block = msgspec.json.Decoder(mcp.ContentBlock).decode

MEMBERS_FROM = 64 * 1024
"""A line this long is decoded with its result's members each left as JSON, in the one pass the
line needs anyway (a 1 MiB ``resources/read`` is passed on as members, never scanned again to
split them); a shorter one keeps its result as one piece of JSON."""

Result = msgspec.Raw | dict[str, msgspec.Raw]
"""A result as the server sent it: one piece of JSON, or (a long line's object) its members."""


class _IncomingMembers(msgspec.Struct, kw_only=True):
    """:class:`mcp.Incoming` with an object result split into its members."""

    jsonrpc: str = "2.0"
    id: mcp.RequestId | msgspec.UnsetType | None = msgspec.UNSET
    method: str | msgspec.UnsetType = msgspec.UNSET
    params: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET
    result: dict[str, msgspec.Raw] | msgspec.UnsetType = msgspec.UNSET
    error: mcp.RpcErrorInfo | msgspec.UnsetType = msgspec.UNSET


_decode_members = msgspec.json.Decoder(_IncomingMembers).decode


def result_json(result: Result | None) -> bytes:
    """``result`` as one piece of JSON (``null`` when there is none), for a typed decode."""
    if result is None:
        return b"null"
    if isinstance(result, dict):
        return _encode(result)
    return result or b"null"


class Response(msgspec.Struct, frozen=True, kw_only=True):
    """The server answered request ``id`` (whose method was ``method``)."""

    id: int
    method: str
    result: Result | None = None
    """As the server sent it: members when the line was long (:data:`MEMBERS_FROM`)."""
    error: mcp.RpcErrorInfo | None = None


class Progress(msgspec.Struct, frozen=True, kw_only=True):
    """``notifications/progress`` for the call with request id ``id``."""

    id: int
    payload: msgspec.Raw


class ToolsChanged(msgspec.Struct, frozen=True):
    """``notifications/tools/list_changed``: list the tools again."""


class ListChanged(msgspec.Struct, frozen=True, kw_only=True):
    """``notifications/resources/list_changed`` or ``.../prompts/list_changed``."""

    kind: Literal["resources", "prompts"]


class ResourceUpdated(msgspec.Struct, frozen=True, kw_only=True):
    """``notifications/resources/updated``: a subscribed resource changed."""

    uri: str


class Log(msgspec.Struct, frozen=True, kw_only=True):
    """A log notification (``notifications/message``), as one line of text."""

    text: str


class Reply(msgspec.Struct, frozen=True, kw_only=True):
    """Bytes to write back: the answer to a request the server sent."""

    data: bytes


Event = Response | Progress | ToolsChanged | ListChanged | ResourceUpdated | Log | Reply


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
        routes: Keep each request's HTTP routing headers (:meth:`http_headers`); off for a
            transport that has no headers (stdio), which then builds none per request.
    """

    def __init__(
        self,
        *,
        max_line: int = DEFAULT_MAX_LINE,
        client_name: str = "toolhost",
        client_version: str = "0",
        channel: str = "on stdout",
        routes: bool = True,
    ) -> None:
        self.state: State = "new"
        self._keep_routes = routes
        self._modern_meta: mcp.RequestMeta | None = None
        """The stateless era's envelope without a progress token or traceparent (the same
        for every request of the session: built once)."""
        self.channel = channel
        self.error: str | None = None
        self.server: mcp.InitializeResult | None = None
        self._client = mcp.Implementation(name=client_name, version=client_version)
        self._lines = LineSplitter(max_line)
        self._next_id = 1
        self.pending: dict[int, str] = {}
        self._progress: set[int] = set()
        self.era: Era | None = None
        """The era the server speaks, once known (``ready``)."""
        self._routes: dict[int, list[tuple[str, str]]] = {}
        self._discovering: int | None = None
        self._late_rid: int | None = None
        """A ``server/discover`` given up on: its late answer is kept (``take_late_discovery``)."""
        self._late: Response | None = None

    @property
    def protocol_version(self) -> str | None:
        """The revision the server chose (None before the handshake)."""
        return self.server.protocolVersion if self.server else None

    # host -> server ----------------------------------------------------------------------

    def _request(
        self, method: str, params: object = msgspec.UNSET, name: str | None = None
    ) -> tuple[int, bytes]:
        rid = self._next_id
        self._next_id += 1
        self.pending[rid] = method
        if self._keep_routes and (self.era == "modern" or method == "server/discover"):
            version = self.protocol_version or mcp.MODERN_VERSIONS[0]
            route = [("MCP-Protocol-Version", version), ("Mcp-Method", method)]
            if name is not None:
                route.append(("Mcp-Name", encode_header_value(name)))
            self._routes[rid] = route
        return rid, _encode(mcp.OutRequest(id=rid, method=method, params=params)) + b"\n"

    def _envelope(self, meta: mcp.RequestMeta | None = None) -> mcp.RequestMeta | None:
        """``meta`` with the stateless era's envelope (as it is in the handshake era)."""
        if self.era != "modern":
            return meta
        if meta is None:
            plain = self._modern_meta
            if plain is None or plain.protocol_version != self.protocol_version:
                plain = self._modern_meta = self._stamp(mcp.RequestMeta())
            return plain
        return self._stamp(meta)

    def _stamp(self, meta: mcp.RequestMeta) -> mcp.RequestMeta:
        return msgspec.structs.replace(
            meta,
            protocol_version=self.protocol_version,
            client_info=self._client_info,
            client_capabilities={},
        )

    @property
    def _client_info(self) -> dict[str, str]:
        return {"name": self._client.name, "version": self._client.version}

    def http_headers(self, rid: int) -> list[tuple[str, str]]:
        """The stateless era's routing headers of request ``rid`` over Streamable HTTP
        (``MCP-Protocol-Version``, ``Mcp-Method``, ``Mcp-Name`` for a call); empty in the
        handshake era, where the session header and the negotiated revision do."""
        return self._routes.get(rid, [])

    def discover(self) -> tuple[int, bytes]:
        """The first request: ``server/discover`` at the newest stateless revision, with its
        envelope. Answer it with :meth:`discovered`, or :meth:`abandon_discover` when no answer
        came in time."""
        if self.state != "new":
            raise ProtocolError(f"cannot discover in state {self.state}")
        self.state = "discovering"
        meta = mcp.RequestMeta(
            protocol_version=mcp.MODERN_VERSIONS[0],
            client_info=self._client_info,
            client_capabilities={},
        )
        rid, line = self._request("server/discover", mcp.MetaParams(meta=meta))
        self._discovering = rid
        return rid, line

    def discovered(self, response: Response) -> bool:
        """Accept the ``server/discover`` answer. True: the server speaks a stateless revision,
        the connection is ready in that era (there is no ``initialized`` to send). False:
        anything else (an error, an answer that names no revision of ours, or one that is not
        a discover result); the connection is ``new`` again, for :meth:`initialize`.

        Raises:
            RequestFailed: The server speaks only stateless revisions, none of ours (-32022
                naming no handshake revision): no era is common.
        """
        self._end_discover()
        if response.error is not None:
            if response.error.code == mcp.UNSUPPORTED_VERSION:
                try:
                    data = msgspec.convert(response.error.data, mcp.UnsupportedVersionData)
                except (msgspec.ValidationError, TypeError):
                    data = mcp.UnsupportedVersionData()
                ours = set(mcp.MODERN_VERSIONS) | set(mcp.SERVER_VERSIONS)
                if data.supported and not ours.intersection(data.supported):
                    self.state = "error"
                    self.error = f"server/discover: no revision in common ({data.supported})"
                    raise RequestFailed("server/discover", response.error)
            return False
        try:
            result = msgspec.json.decode(result_json(response.result), type=mcp.DiscoverResult)
        except (msgspec.ValidationError, msgspec.DecodeError):
            return False
        mutual = [v for v in mcp.MODERN_VERSIONS if v in result.supportedVersions]
        if not mutual:
            return False
        meta = result.meta
        info = meta.server_info if meta is not None and meta.server_info is not None else None
        self.server = mcp.InitializeResult(
            protocolVersion=mutual[0],
            capabilities=result.capabilities,
            serverInfo=info or mcp.Implementation(),
            instructions=result.instructions,
        )
        self.era, self.state = "modern", "ready"
        return True

    def abandon_discover(self) -> None:
        """No answer to ``server/discover`` in time: stop waiting (a late answer is dropped;
        the probe is never cancelled, as the specification asks) and go back to ``new``."""
        if self.state == "discovering":
            self._late_rid = self._discovering
            self._end_discover()

    def take_late_discovery(self) -> bool:
        """The handshake that followed an abandoned ``server/discover`` failed: did the
        discover's late answer come meanwhile, naming a stateless revision of ours? (A server
        slow to start answers both in order; one that speaks the stateless era then refuses the
        ``initialize``.) True: the connection is ready in the stateless era."""
        late, self._late = self._late, None
        self._late_rid = None
        if late is None or self.state not in ("new", "initializing"):
            return False
        state = self.state
        self.state = "discovering"
        try:
            if self.discovered(late):
                return True
        except RequestFailed:
            pass
        self.state = state
        return False

    def _end_discover(self) -> None:
        rid = self._discovering
        if rid is not None:
            self.pending.pop(rid, None)
            self._routes.pop(rid, None)
        self._discovering = None
        if self.state == "discovering":
            self.state = "new"

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
            raw = result_json(response.result)
            self.server = msgspec.json.decode(raw, type=mcp.InitializeResult)
        except (msgspec.ValidationError, msgspec.DecodeError) as exc:
            self._fail(f"invalid initialize result: {exc}")
        self.state, self.era = "ready", "handshake"
        return _encode(mcp.OutNotification(method="notifications/initialized")) + b"\n"

    def list_tools(self, cursor: str | None = None) -> tuple[int, bytes]:
        """A ``tools/list`` request (one page; pass the previous ``nextCursor``)."""
        self._need_ready("tools/list")
        params = mcp.ListToolsParams(cursor=cursor, meta=self._envelope())
        return self._request("tools/list", params)

    def listen(
        self, *, tools: bool = True, subscriptions: tuple[str, ...] = ()
    ) -> tuple[int, bytes]:
        """A ``subscriptions/listen`` request (stateless era): its answer comes only when the
        stream ends; meanwhile ``notifications/tools/list_changed`` arrive as
        :class:`ToolsChanged`."""
        self._need_ready("subscriptions/listen")
        if self.era != "modern":
            raise ProtocolError("subscriptions/listen needs the stateless era")
        caps = self.server.capabilities if self.server is not None else None
        wanted = mcp.SubscriptionFilter(
            toolsListChanged=True if tools else None,
            resourcesListChanged=True if caps is not None and caps.resources is not None else None,
            promptsListChanged=True if caps is not None and caps.prompts is not None else None,
            resourceSubscriptions=list(subscriptions) or None,
        )
        params = mcp.ListenParams(notifications=wanted, meta=self._envelope())
        return self._request("subscriptions/listen", params)

    def ask(
        self, method: str, params: dict[str, object], name: str | None = None
    ) -> tuple[int, bytes]:
        """Any other request of a ready session (``resources/read``, ``prompts/get``,
        ``completion/complete``, the lists, ``resources/subscribe``), with the era's envelope;
        ``name`` is its ``Mcp-Name`` (the URI read, the prompt got)."""
        self._need_ready(method)
        meta = self._envelope()
        if meta is not None:
            params = {**params, "_meta": meta}
        return self._request(method, params, name)

    def probe(self) -> tuple[int, bytes]:
        """The health probe of the era: ``ping`` (handshake), ``server/discover`` (stateless,
        where ``ping`` is gone); any answer, even an error, proves the server alive."""
        if self.era != "modern":
            return self.ping()
        return self._request("server/discover", mcp.MetaParams(meta=self._envelope()))

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
        params = mcp.CallToolParams(name=name, arguments=arguments, meta=self._envelope(meta))
        return self._request("tools/call", params, name)

    def ping(self) -> tuple[int, bytes]:
        """A ``ping`` request (allowed before the handshake completes)."""
        return self._request("ping")

    def cancel(self, rid: int, reason: str) -> bytes:
        """Stop waiting for request ``rid``; returns the ``notifications/cancelled`` line.

        Returns ``b""`` when ``rid`` is no longer pending (answered meanwhile). A later answer for
        it is dropped by :meth:`feed`.
        """
        self._progress.discard(rid)
        self._routes.pop(rid, None)
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

    def _decode(self, line: bytes) -> list[mcp.Incoming] | list[_IncomingMembers]:
        try:
            if line.lstrip().startswith(b"["):
                return _decode_batch(line)
            if len(line) >= MEMBERS_FROM:
                try:
                    return [_decode_members(line)]
                except (msgspec.DecodeError, msgspec.ValidationError):
                    pass  # not an object result, or not JSON: the plain decode says which
            return [_decode(line)]
        except (msgspec.DecodeError, msgspec.ValidationError, RecursionError) as exc:
            raise ProtocolError(
                f"not a JSON-RPC message {self.channel}: {exc}: {preview(line)}"
            ) from exc

    def _accept(self, msg: mcp.Incoming | _IncomingMembers) -> Event | None:
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
        self._routes.pop(rid, None)
        if method is None:
            if rid == self._late_rid:  # a discover given up on: kept for the handshake's end
                self._late_rid = None
                result = None if msg.result is msgspec.UNSET else msg.result
                self._late = Response(id=rid, method="server/discover", result=result, error=error)
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
        if method in ("notifications/resources/list_changed", "notifications/prompts/list_changed"):
            if self.state != "ready":
                return None
            return ListChanged(kind="resources" if "resources" in method else "prompts")
        if method == "notifications/resources/updated":
            try:
                uri = msgspec.json.decode(
                    params if params is not msgspec.UNSET else b"{}", type=dict[str, object]
                ).get("uri")
            except (msgspec.ValidationError, msgspec.DecodeError):
                return None
            return ResourceUpdated(uri=uri) if isinstance(uri, str) else None
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
        return None  # other notifications (cancelled, ...) mean nothing here

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
        page = msgspec.json.decode(result_json(response.result), type=mcp.ListToolsResult)
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


def list_page(response: Response, key: str) -> tuple[list[dict[str, object]], str | None]:
    """The items (``key``: ``resources``, ``resourceTemplates``, ``prompts``) of one list page,
    as the server gave them, and the next cursor.

    Raises:
        RequestFailed: The server answered with an error.
        ProtocolError: The result is not a list page.
    """
    if response.error is not None:
        raise RequestFailed(response.method, response.error)
    try:
        page = msgspec.json.decode(result_json(response.result), type=mcp.ListPage)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise ProtocolError(f"invalid {response.method} result: {exc}") from exc
    items = getattr(page, key) or []
    return items, page.nextCursor or None


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
        result = msgspec.json.decode(result_json(response.result), type=mcp.CallToolResult)
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
