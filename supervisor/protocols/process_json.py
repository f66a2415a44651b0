"""process-json persistent protocol 1 as a sans-IO connection (PROTOCOL 3.1).

# Strategy: one object per worker. The runtime hands it every chunk read from the worker's
# stdout (``feed``) and gets decoded, state-checked messages back; it asks it for the bytes of
# every message to send. The object owns call-id bookkeeping: ids are issued here, never reused,
# and a result is accepted once for a call in flight or abandoned (cancelled, timed out). Any
# breach (non-JSON, unknown type, a result for an unknown call or a second answer, a message
# before ``ready``) raises :class:`ProtocolError` and leaves the connection in the error state.
# A host-service ``request`` is the exception (PROTOCOL 3.5): one whose fields have the wrong
# type or are missing is not a breach but a :class:`MalformedRequest`, which the worker answers
# ``invalid-request`` (on the request's id when that id is a string or an integer, else on
# ``id: null``) and keeps serving. :func:`outcome` turns a ``result`` into the host's
# :class:`~supervisor.protocols.outcome.CallOutcome`.
"""

from __future__ import annotations

from typing import Literal

import msgspec

from supervisor.contracts import wire
from supervisor.protocols.errors import ProtocolError
from supervisor.protocols.framing import LineSplitter
from supervisor.protocols.outcome import CallOutcome, preview

State = Literal["starting", "ready", "closed", "error"]

DEFAULT_MAX_LINE = 16 * 1024 * 1024

_encode = wire.encoder.encode
_decode = wire.worker_decoder.decode


class MalformedRequest(msgspec.Struct, frozen=True):
    """A worker's ``request`` with a missing or wrongly typed field: answer ``invalid-request``."""

    id: str | int | None
    """The request's id when it is usable (a string or an integer), else ``None``."""
    problem: str


class _AnyRequest(msgspec.Struct, tag_field="type", tag="request"):
    """A ``request`` line with every field kept raw (only decoded after the strict decode
    failed, to tell a malformed request from a line that is no message at all)."""

    id: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET
    callId: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET
    method: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET
    params: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET


_decode_any_request = msgspec.json.Decoder(_AnyRequest).decode

_KINDS = {ord("{"): "an object", ord("["): "an array", ord('"'): "a string", ord("n"): "null"}
_KINDS.update({ord("t"): "a boolean", ord("f"): "a boolean"})


def _kind(raw: msgspec.Raw) -> str:
    """The JSON type of a raw value, from its first byte (nothing is decoded)."""
    first = memoryview(raw)[:1].tobytes()
    kind = _KINDS.get(first[0]) if first else None
    if kind is not None:
        return kind
    return "an integer" if _raw_int(raw) is not None else "a number"


def _raw_int(raw: msgspec.Raw) -> int | None:
    try:
        return msgspec.json.decode(raw, type=int)
    except msgspec.ValidationError:
        return None  # 1.5, 1e3


def _field(
    problems: list[str], name: str, raw: msgspec.Raw | msgspec.UnsetType, want: tuple[str, ...]
) -> None:
    if raw is msgspec.UNSET or _kind(raw) == "null":
        problems.append(f"`{name}` is missing")
        return
    kind = _kind(raw)
    if kind not in want:
        problems.append(f"`{name}` must be {' or '.join(want)}, got {kind}")


def _malformed(line: bytes, error: msgspec.ValidationError) -> MalformedRequest:
    """``line`` failed the strict decode: a request with bad fields, or a protocol breach."""
    try:
        req = _decode_any_request(line)
    except msgspec.DecodeError:  # not a request at all (or not an object)
        raise ProtocolError(f"invalid message on stdout: {error}: {preview(line)}") from error
    problems: list[str] = []
    _field(problems, "id", req.id, ("a string", "an integer"))
    _field(problems, "callId", req.callId, ("an integer",))
    _field(problems, "method", req.method, ("a string",))
    if req.params is not msgspec.UNSET and _kind(req.params) != "an object":
        problems.append(f"`params` must be an object, got {_kind(req.params)}")
    rid: str | int | None = None
    if req.id is not msgspec.UNSET:
        kind = _kind(req.id)
        if kind == "a string":
            rid = msgspec.json.decode(req.id, type=str)
        elif kind == "an integer":
            rid = _raw_int(req.id)
    return MalformedRequest(id=rid, problem="; ".join(problems) or str(error))


def strict_problem(req: wire.Request) -> str | None:
    """What a well-typed request still lacks (``null`` counts as absent), or ``None``."""
    problems = [f"`{k}` is missing" for k in ("id", "callId", "method") if getattr(req, k) is None]
    if memoryview(req.params)[:1] != b"{":
        problems.append(f"`params` must be an object, got {_kind(req.params)}")
    return "; ".join(problems) or None


def outcome(result: wire.Result, pid: int | None) -> CallOutcome:
    """A ``result`` message in host terms (the one change of shape on the call path), with the
    pid of the worker that sent it."""
    return CallOutcome(
        ok=result.ok,
        data=result.data,
        content=result.content,
        code=result.code,
        error=result.error,
        details=result.details,
        cpu_ms=result.cpuMs,
        pid=pid,
    )


class ProcessJsonConnection:
    """The host side of one persistent process-json worker."""

    def __init__(self, *, max_line: int = DEFAULT_MAX_LINE) -> None:
        self.state: State = "starting"
        self.ready: wire.Ready | None = None
        self.error: str | None = None
        self._lines = LineSplitter(max_line)
        self._next_id = 1
        self._ping_seq = 0
        self.inflight: set[int] = set()
        self.abandoned: set[int] = set()

    # host -> worker ----------------------------------------------------------------------

    def init(self, msg: wire.Init) -> bytes:
        """The first line of the conversation."""
        return _encode(msg) + b"\n"

    def call(
        self,
        tool: str,
        input_raw: msgspec.Raw,
        deadline_ms: int,
        traceparent: str | None = None,
        tracestate: str | None = None,
    ) -> tuple[int, bytes]:
        """Issue a call: returns its new id and the line to write (``traceparent`` and
        ``tracestate`` ride along when tracing is on)."""
        if self.state != "ready":
            raise ProtocolError(f"cannot call in state {self.state}")
        call_id = self._next_id
        self._next_id += 1
        self.inflight.add(call_id)
        return call_id, _encode(
            wire.CallMessage(
                id=call_id,
                tool=tool,
                input=input_raw,
                deadlineMs=deadline_ms,
                traceparent=traceparent,
                tracestate=tracestate,
            )
        ) + b"\n"

    def abandon(self, call_id: int) -> bytes:
        """Give up waiting on a call (deadline or cancel); returns the ``cancel`` line.

        A later answer for it is accepted once and reported as usual; the caller ignores it.
        """
        if call_id in self.inflight:
            self.inflight.discard(call_id)
            self.abandoned.add(call_id)
        return _encode(wire.Cancel(id=call_id)) + b"\n"

    def ping(self) -> tuple[str, bytes]:
        self._ping_seq += 1
        ping_id = f"p{self._ping_seq}"
        return ping_id, _encode(wire.Ping(id=ping_id)) + b"\n"

    def respond(self, response: wire.Response) -> bytes:
        """The line answering a worker's ``request``."""
        return _encode(response) + b"\n"

    def shutdown(self) -> bytes:
        self.state = "closed" if self.state != "error" else "error"
        return _encode(wire.Shutdown()) + b"\n"

    # worker -> host ----------------------------------------------------------------------

    def feed(self, data: bytes) -> list[wire.WorkerMessage | MalformedRequest]:
        """Decode every complete line in ``data`` (may be empty) into checked messages.

        Raises:
            ProtocolError: On the first breach; later calls raise it again.
        """
        if self.state == "error":
            raise ProtocolError(self.error or "connection in error state")
        out: list[wire.WorkerMessage | MalformedRequest] = []
        try:
            lines = self._lines.feed(data)
            for line in lines:
                if not line.strip():
                    continue
                msg: wire.WorkerMessage | MalformedRequest
                try:
                    msg = _decode(line)
                except msgspec.ValidationError as exc:
                    msg = _malformed(line, exc)
                except (msgspec.DecodeError, RecursionError) as exc:  # nested too deeply
                    raise ProtocolError(
                        f"invalid message on stdout: {exc}: {preview(line)}"
                    ) from exc
                if type(msg) is wire.Request:
                    problem = strict_problem(msg)
                    if problem is not None:
                        msg = MalformedRequest(id=msg.id, problem=problem)
                if self._accept(msg):
                    out.append(msg)
            return out
        except ProtocolError as exc:
            self.state = "error"
            self.error = exc.message
            exc.accepted = out
            raise

    def _accept(self, msg: wire.WorkerMessage | MalformedRequest) -> bool:
        match msg:
            case wire.Result(id=call_id):
                if call_id in self.inflight:
                    self.inflight.discard(call_id)
                    return True
                if call_id in self.abandoned:
                    self.abandoned.discard(call_id)
                    return True
                if 0 < call_id < self._next_id:
                    raise ProtocolError(f"second answer for call {call_id}")
                raise ProtocolError(f"answer for unknown call {call_id}")
            case wire.Progress(id=call_id):
                if self.state != "ready":
                    raise ProtocolError("progress before ready")
                if call_id in self.inflight:
                    return True
                if 0 < call_id < self._next_id:
                    return False  # late progress for a finished or abandoned call
                raise ProtocolError(f"progress for unknown call {call_id}")
            case wire.Ready():
                if self.state != "starting":
                    raise ProtocolError("second ready message")
                if msg.protocol != 1:
                    raise ProtocolError(f"unsupported protocol version {msg.protocol}")
                if msg.concurrency < 1:
                    raise ProtocolError(f"concurrency must be >= 1, got {msg.concurrency}")
                self.state = "ready"
                self.ready = msg
                return True
            case wire.Pong():
                if self.state == "starting":
                    raise ProtocolError("pong before ready")
                return True
            case wire.Log():
                return True
            case wire.Request():
                if self.state != "ready":
                    raise ProtocolError("request before ready")
                return True  # whether it names a call in flight is the host services' check
            case MalformedRequest():
                if self.state != "ready":
                    raise ProtocolError(f"request before ready ({msg.problem})")
                return True
        raise ProtocolError(f"unexpected message {type(msg).__name__}")  # pragma: no cover
