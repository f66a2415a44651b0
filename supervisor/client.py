"""A Python kernel client for toolhost (trio): connect, hello, catalog, subscribe, invoke, cancel.

Example::

    async with open_client(".toolhost/host.sock") as client:
        env = await client.invoke("file.hash", {"path": "README.md"})
        print(env.status, env.content)

The client multiplexes any number of requests over one connection; responses are matched by id,
events are routed to the request they belong to (``tool.start``/``tool.progress``) or to the
subscription channel (``catalog.changed``). :meth:`Client.mirror_catalog` keeps a
:class:`CatalogMirror`: the catalog as of the latest event, without asking again.
"""

from __future__ import annotations

import itertools
import math
import os
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any, Literal, cast

import msgspec
import trio

from supervisor.contracts.envelope import EnvelopeView
from supervisor.contracts.rpc import Catalog, CatalogChanged, HealthResult, Request
from supervisor.contracts.snapshot import Descriptor
from supervisor.processes.direct_write import read_ready
from supervisor.protocols.framing import LengthPrefixSplitter, LineSplitter, length_prefixed
from supervisor.server.link import FrameLink

EventSink = Callable[[str, Any], None]
MAX_FRAME = 256 * 1024 * 1024
READ_SIZE = 1 << 16
BIG_READ_SIZE = 1 << 20


class RpcError(Exception):
    """The host answered a request with a protocol error."""

    def __init__(self, code: str, message: str, data: Any = None) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.data = data


class ConnectionLost(Exception):
    """The connection closed while a request was waiting."""


class CatalogMirror:
    """The host's tool descriptors as this client knows them: one ``capability.catalog.get``
    plus every ``catalog.changed`` after it (changed or added descriptors replace, ``removed``
    names leave). Events at or below the snapshot's revision are already in it and skipped.
    """

    def __init__(self) -> None:
        self.revision = -1
        self.tools: dict[str, Descriptor] = {}
        self._based = False
        self._early: list[CatalogChanged] = []
        self._moved = trio.Event()

    def reset(self, catalog: Catalog) -> None:
        """Start from a ``capability.catalog.get`` answer (then apply what came meanwhile)."""
        self.revision = catalog.revision
        self.tools = {d.name: d for d in catalog.tools}
        self._based = True
        early, self._early = self._early, []
        for event in early:
            self.apply(event)
        self._pulse()

    def apply(self, event: CatalogChanged) -> None:
        """Fold one ``catalog.changed`` event in (kept for later before :meth:`reset`)."""
        if not self._based:
            self._early.append(event)
            return
        if event.revision <= self.revision:
            return
        for d in event.tools:
            self.tools[d.name] = d
        for name in event.removed:
            self.tools.pop(name, None)
        self.revision = event.revision
        self._pulse()

    def descriptors(self) -> list[Descriptor]:
        """Every descriptor, sorted by name (the order ``capability.catalog.get`` uses)."""
        return [self.tools[n] for n in sorted(self.tools)]

    async def wait_revision(self, revision: int) -> None:
        """Return once the mirror is at ``revision`` or later."""
        while self.revision < revision:
            await self._moved.wait()

    def _pulse(self) -> None:
        self._moved.set()
        self._moved = trio.Event()


Answered = Callable[[Any, "BaseException | None"], None]
"""Called with a request's result, or its error (:class:`RpcError`, :class:`ConnectionLost`)."""


class _Pending:
    __slots__ = (
        "done",
        "error",
        "members",
        "on_answer",
        "on_event",
        "raw",
        "result",
        "split",
        "typed",
    )

    def __init__(
        self,
        on_event: EventSink | None,
        raw: bool = False,
        members: bool = False,
        on_answer: Answered | None = None,
        typed: type | None = None,
    ) -> None:
        self.done = trio.Event()
        self.result: Any = None
        self.error: BaseException | None = None
        self.on_event = on_event
        self.typed = typed
        """The result is wanted as this msgspec type: handed over as the object on an in-memory
        link, decoded from the answer's JSON in one pass on a socket."""
        self.raw = raw or members or typed is not None
        self.members = members
        self.split = False
        """The result is already the members (decoded in one pass by the reader)."""
        self.on_answer = on_answer
        """Called by the reader when the answer comes (:meth:`Client.request_soon`)."""

    def finish(self) -> None:
        if self.typed is not None and self.error is None:
            self._as_typed(self.typed)
        self.done.set()
        on_answer = self.on_answer
        if on_answer is not None:
            self.on_answer = None
            on_answer(self.result, self.error)

    def _as_typed(self, tp: type) -> None:
        result = self.result
        if isinstance(result, tp):
            return
        try:
            if not isinstance(result, msgspec.Raw):  # MessagePack: plain values
                result = msgspec.json.encode(result)
            self.result = msgspec.json.decode(result, type=tp)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            self.result = None
            self.error = RpcError(
                "internal", f"the host's answer does not fit {tp.__name__}: {exc}"
            )


class _Answer(msgspec.Struct):
    """A frame's id and result, the result left as JSON (for requests made with ``raw``)."""

    id: Any = None
    result: msgspec.Raw = msgspec.Raw(b"")
    """Empty when the frame has no result (an event, an error)."""


class _Members(msgspec.Struct):
    """A frame's id and result, the result's members each left as JSON (``members`` requests)."""

    id: Any = None
    result: dict[str, msgspec.Raw] | None = None


_answer_decoder = msgspec.json.Decoder(_Answer)
_members_decoder = msgspec.json.Decoder(_Members)
_split_decoder = msgspec.json.Decoder(dict[str, msgspec.Raw])


def _split(raw: msgspec.Raw) -> dict[str, msgspec.Raw] | None:
    """A JSON object's members, each value left as JSON; None when ``raw`` is not an object."""
    try:
        return _split_decoder.decode(raw)
    except msgspec.ValidationError:
        return None


class Client:
    """One connection to a host. Use :func:`open_client` to create it."""

    def __init__(self, stream: trio.abc.Stream | FrameLink) -> None:
        self.stream = stream
        self._link = stream if isinstance(stream, FrameLink) else None
        """An in-memory connection to a host in this process (whole frames, no socket)."""
        self.encoding: Literal["json", "msgpack"] = "json"
        self.server: dict[str, Any] = {}
        self._ids = itertools.count(1)
        self._pending: dict[Any, _Pending] = {}
        self._lines: LineSplitter | None = LineSplitter(MAX_FRAME)
        self._frames: LengthPrefixSplitter | None = None
        self._switch_after: Any = None
        self._send, self._recv = trio.open_memory_channel[bytes](math.inf)
        self._events_send, self.events = trio.open_memory_channel[Any](math.inf)
        self._closed = False
        self.mirror: CatalogMirror | None = None
        # Write-through: on a socket, a request is written by the task that makes it while
        # nothing is queued or being sent (no hop through the writer task: one scheduler batch
        # less per request); what the socket cannot take goes to the writer task, in order.
        self._fd = stream.socket.fileno() if isinstance(stream, trio.SocketStream) else -1
        self._backlog = 0
        """Frames handed to the writer task and not yet fully sent."""
        self._raw = 0
        """Requests in flight whose result is wanted as JSON (``request(raw=True)``)."""
        self._members = 0
        """Of those, the ones wanting the result's members as JSON (``request(members=True)``)."""

    def new_id(self) -> int:
        return next(self._ids)

    # transport ---------------------------------------------------------------------------

    def _encode(self, obj: Any) -> bytes:
        if self.encoding == "json":
            return msgspec.json.encode(obj) + b"\n"
        return length_prefixed(msgspec.msgpack.encode(obj))

    def _push(self, frame: bytes) -> None:
        """Send ``frame`` now if the socket takes it and nothing is ahead of it; else queue
        (the rest of) it for the writer task."""
        if self._link is not None:
            self._link.send(frame)
            return
        if self._fd >= 0 and self._backlog == 0:
            try:
                sent = os.write(self._fd, frame)
            except OSError:  # full (BlockingIOError) or broken: the writer task finds out
                sent = 0
            if sent == len(frame):
                return
            frame = frame[sent:]
        self._backlog += 1
        self._send.send_nowait(frame)

    async def _writer(self) -> None:
        if isinstance(self.stream, FrameLink):  # frames go to the host from _push
            return
        recv = self._recv
        async for frame in recv:
            batch = [frame]
            while True:
                try:
                    batch.append(recv.receive_nowait())
                except trio.WouldBlock:
                    break
            try:
                await self.stream.send_all(frame if len(batch) == 1 else b"".join(batch))
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                return
            finally:
                self._backlog -= len(batch)

    async def _reader(self) -> None:
        size = READ_SIZE
        fd = self._fd
        stream = self.stream
        try:
            if isinstance(stream, FrameLink):
                await self._link_reader(stream)
                return
            while True:
                try:
                    # On a socket: wait, then read (the answer comes later than the request
                    # went out, so reading first would fail once per answer).
                    data: bytes | bytearray
                    if fd >= 0:
                        data = await read_ready(fd, size)
                    else:
                        data = await stream.receive_some(size)
                except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                    break
                if not data:
                    break
                # A full read means a large answer is streaming: bigger reads (fewer wake-ups)
                # until it is through.
                size = BIG_READ_SIZE if len(data) == size else READ_SIZE
                self._feed(data)
        finally:
            self._closed = True
            for p in self._pending.values():
                if not p.done.is_set():
                    p.error = ConnectionLost("connection closed")
                    p.finish()
            self._events_send.close()

    async def _link_reader(self, link: FrameLink) -> None:
        """Read an in-memory link: answers come at once from the host's task that sends them
        (``link.on_frame``), events and what came before this ran through ``link.frames`` (in
        order: an answer waits behind a queued frame). A frame that fails in ``on_frame`` (a
        callback raising) is raised in this task, as on a socket, never in the host's."""
        failed: list[Exception] = []

        def fail(exc: Exception) -> None:
            failed.append(exc)
            link.on_frame = link.on_object = None
            try:
                link.to_client.send_nowait(b"")  # wakes this task to raise it
                link.queued += 1
            except trio.ClosedResourceError:
                pass  # the host's end closed: this task wakes and raises it anyway

        def take(frame: bytes) -> None:
            if failed:
                return
            try:
                self._frames_in([frame])
            except Exception as exc:
                fail(exc)

        def take_object(request_id: Any, result: Any) -> bool:
            """A response as the host's object: taken when its request is ``typed`` so, or
            when it wants JSON and the result is JSON already (a hosted server's read, passed
            on as it came: no frame around it to encode here and split there), or its members
            are wanted and the result is them already."""
            if failed:
                return False
            pending = self._pending.get(request_id)
            if pending is None:
                return False
            if pending.typed is not None:
                if not isinstance(result, pending.typed):
                    return False
            elif (
                pending.members
                and type(result) is dict
                and all(type(v) is msgspec.Raw for v in result.values())
            ):
                pending.split = True  # members already (a hosted server's long answer)
            elif not pending.raw or not isinstance(result, msgspec.Raw):
                return False
            elif pending.members:
                result = _split(result)
                if result is None:  # not an object: as a frame, the way a socket's goes
                    return False
                pending.split = True
            del self._pending[request_id]
            pending.result = result
            try:
                pending.finish()
            except Exception as exc:
                fail(exc)
            return True

        link.on_frame = take
        link.on_object = take_object
        try:
            async for frame in link.frames:
                link.queued -= 1
                if failed:
                    raise failed[0]
                self._frames_in([frame])
        finally:
            link.on_frame = link.on_object = None
        if failed:
            raise failed[0]

    def _feed(self, data: bytes | bytearray) -> None:
        if self._lines is not None:
            frames = self._lines.feed(data)
        else:
            assert self._frames is not None
            frames = self._frames.feed(data)
        self._frames_in(frames)

    def _frames_in(self, frames: list[bytes]) -> None:
        """Route whole frames (JSON, or MessagePack after the hello that switched)."""
        i = 0
        while i < len(frames):
            frame = frames[i]
            i += 1
            if self._lines is not None and not frame.strip():
                continue
            if self._raw and self._lines is not None and self._route_raw(frame):
                continue
            msg = (
                msgspec.json.decode(frame)
                if self._lines is not None
                else msgspec.msgpack.decode(frame)
            )
            self._route(msg)
            if self._switch_after is not None and msg.get("id") == self._switch_after:
                self._switch_after = None
                rest = b"".join(f + b"\n" for f in frames[i:])
                assert self._lines is not None
                rest += self._lines.take_pending()
                self._lines, self._frames = None, LengthPrefixSplitter(MAX_FRAME)
                frames = self._frames.feed(rest) if rest else []
                i = 0

    def _route_raw(self, frame: bytes) -> bool:
        """Answer a ``raw`` request with its result as JSON (never decoded into objects), a
        ``members`` one with its result's members as JSON (one pass over a large answer, not
        two); False for any other frame (an event, an error, another request's answer)."""
        if self._members:
            try:
                top = _members_decoder.decode(frame)
            except msgspec.ValidationError:  # a result that is not an object
                top = None
            if top is not None and top.result is not None and top.id is not None:
                pending = self._pending.get(top.id)
                if pending is not None and pending.members:
                    del self._pending[top.id]
                    pending.result = top.result
                    pending.split = True
                    pending.finish()
                    return True
        answer = _answer_decoder.decode(frame)
        if not answer.result or answer.id is None:
            return False
        pending = self._pending.get(answer.id)
        if pending is None or not pending.raw:
            return False
        del self._pending[answer.id]
        pending.result = answer.result
        pending.finish()
        return True

    def _route(self, msg: dict[str, Any]) -> None:
        if "event" in msg:
            rid = msg.get("id")
            pending = self._pending.get(rid) if rid is not None else None
            if pending is not None and pending.on_event is not None:
                pending.on_event(msg["event"], msg.get("data"))
            elif rid is None:
                if self.mirror is not None and msg["event"] == "catalog.changed":
                    self.mirror.apply(msgspec.convert(msg.get("data"), CatalogChanged))
                self._events_send.send_nowait(msg)
            return
        pending = self._pending.pop(msg.get("id"), None)
        if pending is None:
            return
        if "error" in msg and msg["error"] is not None:
            err = msg["error"]
            pending.error = RpcError(
                err.get("code", "internal"), err.get("message", ""), err.get("data")
            )
        else:
            pending.result = msg.get("result")
        pending.finish()

    # requests ----------------------------------------------------------------------------

    async def request(
        self,
        method: str,
        params: Any = None,
        *,
        request_id: Any = None,
        on_event: EventSink | None = None,
        raw: bool = False,
        members: bool = False,
        typed: type | None = None,
    ) -> Any:
        """Send one request and wait for its response; with ``raw`` the result is the JSON
        the host sent (``msgspec.Raw``), for a caller that passes it on without looking in;
        with ``members`` (a result that is an object) a dict of its members, each value the
        JSON the host sent, for a caller that passes them on but picks among them; with
        ``typed`` (a msgspec type, e.g. :class:`~supervisor.contracts.envelope.Envelope`) the
        result as that type: the host's own object on an in-memory link, decoded in one pass
        on a socket.

        Raises:
            RpcError: The host answered with an error.
            ConnectionLost: The connection closed first.
        """
        if self._closed:
            raise ConnectionLost("connection closed")
        rid = request_id if request_id is not None else self.new_id()
        pending = _Pending(on_event, raw, members, typed=typed)
        self._pending[rid] = pending
        body: dict[str, Any] = {"id": rid, "method": method, "params": params or {}}
        if method == "server.hello" and (params or {}).get("encoding") == "msgpack":
            self._switch_after = rid
        frame = self._encode(body)
        self._raw += pending.raw
        self._members += members
        try:
            self._push(frame)
            await pending.done.wait()
        finally:
            self._raw -= pending.raw
            self._members -= members
            self._pending.pop(rid, None)
        if pending.raw and pending.typed is None and pending.error is None and not pending.split:
            result = pending.result
            if not isinstance(result, msgspec.Raw):
                result = msgspec.Raw(msgspec.json.encode(result))  # MessagePack
            pending.result = _split(result) if members else result
        if method == "server.hello" and (params or {}).get("encoding") == "msgpack":
            self.encoding = "msgpack"
        if pending.error is not None:
            raise pending.error
        return pending.result

    def request_soon(
        self,
        method: str,
        params: Any,
        *,
        request_id: Any,
        on_answer: Answered,
        typed: type | None = None,
        members: bool = False,
    ) -> None:
        """Send one request now and return; ``on_answer`` is called from the connection's
        reader with the result (decoded; with ``typed`` as in :meth:`request`) or the error,
        exactly once (at once when the connection is closed). For a caller that answers from
        the reader, with no task per request. ``params`` may be the method's params struct: on
        an in-memory link it is handed over as it is (no encode, and no decode in the host)."""
        if self._closed:
            on_answer(None, ConnectionLost("connection closed"))
            return
        if typed is not None:
            self._raw += 1  # on a socket its answer is split off as JSON, then decoded typed

            def answered(result: Any, error: BaseException | None) -> None:
                self._raw -= 1
                on_answer(result, error)

            self._pending[request_id] = _Pending(None, on_answer=answered, typed=typed)
        elif members:  # as :meth:`request` with ``members``
            self._raw += 1
            self._members += 1

            def split(result: Any, error: BaseException | None) -> None:
                self._raw -= 1
                self._members -= 1
                if error is None and not pending.split:
                    if not isinstance(result, msgspec.Raw):
                        result = msgspec.Raw(msgspec.json.encode(result))  # MessagePack
                    result = _split(result)
                on_answer(result, error)

            pending = _Pending(None, members=True, on_answer=split)
            self._pending[request_id] = pending
        else:
            self._pending[request_id] = _Pending(None, on_answer=on_answer)
        link = self._link
        if link is not None and isinstance(params, msgspec.Struct):
            # The host's in-memory end takes params that are already the method's struct.
            link.send(Request(id=request_id, method=method, params=cast(msgspec.Raw, params)))
            return
        self._push(self._encode({"id": request_id, "method": method, "params": params}))

    async def hello(
        self, *, encoding: str = "json", name: str = "toolhost-client"
    ) -> dict[str, Any]:
        if self._link is not None and encoding != "json":
            raise ValueError("an in-memory kernel connection speaks JSON only")
        result = await self.request(
            "server.hello", {"client": {"name": name, "version": "1"}, "encoding": encoding}
        )
        self.server = result
        return result

    async def catalog(self) -> Catalog:
        return msgspec.convert(await self.request("capability.catalog.get"), Catalog)

    async def subscribe(self) -> int:
        """Start ``catalog.changed`` events on :attr:`events`; returns the current revision."""
        result = await self.request("capability.catalog.subscribe")
        return int(result["revision"])

    async def mirror_catalog(self) -> CatalogMirror:
        """Subscribe, read the catalog, and keep :attr:`mirror` up to date from then on."""
        if self.mirror is None:
            self.mirror = CatalogMirror()
            await self.subscribe()
            self.mirror.reset(await self.catalog())
        return self.mirror

    async def tools(self, fmt: str = "native") -> list[Any]:
        return (await self.request("tools.list", {"format": fmt}))["tools"]

    async def invoke(
        self,
        tool: str,
        input: Any = None,
        *,
        timeout_ms: int | None = None,
        approval: dict[str, Any] | None = None,
        stream: bool = False,
        on_event: EventSink | None = None,
        request_id: Any = None,
    ) -> EnvelopeView:
        """Invoke a tool; returns the envelope (``status`` tells success from failure)."""
        params: dict[str, Any] = {"tool": tool, "input": {} if input is None else input}
        if timeout_ms is not None:
            params["timeoutMs"] = timeout_ms
        if approval is not None:
            params["approval"] = approval
        if stream:
            params["stream"] = True
        result = await self.request(
            "tools.invoke", params, request_id=request_id, on_event=on_event
        )
        return msgspec.convert(result, EnvelopeView)

    async def cancel(self, request_id: Any) -> bool:
        return bool((await self.request("tools.cancel", {"id": request_id}))["cancelled"])

    async def health(self) -> HealthResult:
        return msgspec.convert(await self.request("system.health"), HealthResult)

    async def stats(self) -> dict[str, Any]:
        return await self.request("system.stats")

    async def restart(self, sidecar: str, *, force: bool = False) -> bool:
        params: dict[str, Any] = {"sidecar": sidecar}
        if force:
            params["force"] = True
        return bool((await self.request("sidecar.restart", params))["restarted"])


@asynccontextmanager
async def open_client(
    path: str | os.PathLike[str],
    *,
    encoding: str = "json",
    name: str = "toolhost-client",
    hello: bool = True,
) -> AsyncIterator[Client]:
    """Connect to a host's Unix socket (and say hello) for the duration of the block."""
    stream = await trio.open_unix_socket(os.fspath(path))
    async with client_on_stream(stream, encoding=encoding, name=name, hello=hello) as client:
        yield client


@asynccontextmanager
async def client_on_stream(
    stream: trio.abc.Stream | FrameLink,
    *,
    encoding: str = "json",
    name: str = "toolhost-client",
    hello: bool = True,
) -> AsyncIterator[Client]:
    """A client on an already connected stream, or the in-memory link of a host in this
    process (closed at the end of the block)."""
    client = Client(stream)
    try:
        async with stream, trio.open_nursery() as nursery:
            nursery.start_soon(client._reader)
            nursery.start_soon(client._writer)
            try:
                if hello:
                    await client.hello(encoding=encoding, name=name)
                yield client
            finally:
                nursery.cancel_scope.cancel()
    except BaseExceptionGroup as group:
        # Callers see the error they caused (RpcError, ConnectionLost...), not trio's wrapping.
        leaf = single_leaf(group)
        if leaf is group:
            raise
        raise leaf from None


def single_leaf(exc: BaseException) -> BaseException:
    """The one exception inside nested single-member exception groups (else ``exc`` itself)."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc
