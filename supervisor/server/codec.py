"""Per-connection encodings of the kernel protocol: JSON lines or length-prefixed MessagePack.

# Strategy: one :class:`Codec` per connection and encoding, its encoders and decoders built
# once. Results may hold :class:`msgspec.Raw` JSON (envelope ``data``, progress payloads): JSON
# connections copy those bytes through untouched; MessagePack connections get them decoded
# once, at encode time. A frame that does not decode is a :class:`BadFrame` (answered
# ``invalid-request`` with the id when it can be recovered), params that do not fit their
# method's Struct a :class:`BadParams` (``invalid-params``): never a traceback on the socket.
"""

from __future__ import annotations

from typing import Any, Literal, TypeVar

import msgspec

from supervisor.contracts.envelope import Envelope, EnvelopeView
from supervisor.contracts.rpc import (
    MSGPACK_REFUSES,
    ErrorResponse,
    Event,
    Request,
    RequestId,
    Response,
    RpcError,
)
from supervisor.contracts.validation import describe
from supervisor.protocols.framing import length_prefixed

T = TypeVar("T")
Encoding = Literal["json", "msgpack"]

_json_encoder = msgspec.json.Encoder()
_msgpack_encoder = msgspec.msgpack.Encoder()
_json_request = msgspec.json.Decoder(Request)
_msgpack_request = msgspec.msgpack.Decoder(Request)
_json_params: dict[type, msgspec.json.Decoder[Any]] = {}
_msgpack_params: dict[type, msgspec.msgpack.Decoder[Any]] = {}


class BadFrame(Exception):
    """A frame that is not a valid request; ``request_id`` is set when it could be recovered."""

    def __init__(self, message: str, request_id: RequestId | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.request_id = request_id


class BadParams(Exception):
    """Params that do not fit the method; the message names the JSON path."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def _recover_id(obj: Any) -> RequestId | None:
    if isinstance(obj, dict):
        rid = obj.get("id")
        if isinstance(rid, int | str) and not isinstance(rid, bool):
            return rid
    return None


_NO_MSGPACK = "no MessagePack form (ask over JSON)"


def _json_safe(value: Any) -> Any:
    """Replace Raw JSON by plain values, for encoders other than JSON."""
    if isinstance(value, msgspec.Raw):
        return msgspec.json.decode(value) if len(value) else None
    if type(value) is dict and any(type(v) is msgspec.Raw for v in value.values()):
        # a hosted server's long answer: its members, each still JSON
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, Envelope):
        return EnvelopeView(
            status=value.status,
            tool=value.tool,
            content=value.content,
            data=_json_safe(value.data),
            error=value.error,
            meta=value.meta,
        )
    return value


class Codec:
    """Encode and decode frames for one connection.

    Args:
        encoding: ``json`` or ``msgpack``.
        framed: Add stream framing (a newline for JSON, a 4-byte length for MessagePack). Message
            transports such as the WebSocket frame on their own and use ``framed=False``.
    """

    def __init__(self, encoding: Encoding = "json", *, framed: bool = True) -> None:
        self.encoding: Encoding = encoding
        self.framed = framed
        self.binary = encoding == "msgpack"
        if framed:
            self._json_end = b"\n"
            self._pack: Any = length_prefixed
        else:
            self._json_end = b""
            self._pack = bytes

    # decoding ----------------------------------------------------------------------------

    def request(self, frame: bytes | Request) -> Request:
        """Decode one frame into a request (one an in-memory client handed over decoded is
        taken as it is: ``server/memory.py``).

        Raises:
            BadFrame: Not a valid request.
        """
        if isinstance(frame, Request):
            return frame
        json_mode = self.encoding == "json"
        try:
            return _json_request.decode(frame) if json_mode else _msgpack_request.decode(frame)
        except msgspec.ValidationError as exc:
            try:
                obj = msgspec.json.decode(frame) if json_mode else msgspec.msgpack.decode(frame)
            except msgspec.DecodeError:
                obj = None
            raise BadFrame(f"invalid request: {describe(exc, obj)}", _recover_id(obj)) from exc
        except msgspec.DecodeError as exc:
            kind = "JSON" if json_mode else "MessagePack"
            raise BadFrame(f"invalid request: not {kind}: {exc}") from exc
        except RecursionError as exc:  # a hostile frame must not end the host
            raise BadFrame("invalid request: nested too deeply") from exc

    def params(self, raw: msgspec.Raw, tp: type[T]) -> T:
        """Decode ``params`` into the method's struct.

        Raises:
            BadParams: With a message naming the offending path.
        """
        dec: msgspec.json.Decoder[Any] | msgspec.msgpack.Decoder[Any]
        if self.encoding == "json":
            jdec = _json_params.get(tp)
            if jdec is None:
                jdec = _json_params[tp] = msgspec.json.Decoder(tp)
            dec = jdec
        else:
            mdec = _msgpack_params.get(tp)
            if mdec is None:
                mdec = _msgpack_params[tp] = msgspec.msgpack.Decoder(tp)
            dec = mdec
        try:
            result: T = dec.decode(raw)
            return result
        except msgspec.ValidationError as exc:
            try:
                obj = self.plain(raw)
            except msgspec.DecodeError:
                obj = None
            raise BadParams(describe(exc, obj, "params")) from exc
        except msgspec.DecodeError as exc:
            raise BadParams(f"params: {exc}") from exc
        except RecursionError as exc:
            raise BadParams("params: nested too deeply") from exc

    def plain(self, raw: msgspec.Raw) -> Any:
        """Decode a Raw value of this connection's encoding into plain Python values."""
        if self.encoding == "json":
            return msgspec.json.decode(raw)
        return msgspec.msgpack.decode(raw)

    def to_json(self, raw: msgspec.Raw) -> msgspec.Raw:
        """A Raw input of this connection's encoding as Raw JSON (for a sidecar)."""
        if self.encoding == "json":
            return raw
        return msgspec.Raw(_json_encoder.encode(msgspec.msgpack.decode(raw)))

    # encoding ----------------------------------------------------------------------------

    def frame(self, body: bytes) -> bytes:
        return body + self._json_end if self.encoding == "json" else self._pack(body)

    def response(self, request_id: RequestId, result: Any) -> bytes:
        """The response frame; on a MessagePack connection a result that has no MessagePack
        form (JSON from a sidecar holding an integer over 64 bits) is the error ``internal``,
        saying so: that JSON is valid, and what a sidecar sends must never end the task that
        answers (a worker's reader, a connection's)."""
        if self.encoding == "json":
            return _json_encoder.encode(Response(id=request_id, result=result)) + self._json_end
        try:
            body = _msgpack_encoder.encode(Response(id=request_id, result=_json_safe(result)))
        except MSGPACK_REFUSES as exc:
            return self.error(request_id, "internal", f"{_NO_MSGPACK}: {exc}")
        return self._pack(body)

    def error(
        self,
        request_id: RequestId | None,
        code: str,
        message: str,
        data: dict[str, Any] | None = None,
    ) -> bytes:
        body = ErrorResponse(id=request_id, error=RpcError(code=code, message=message, data=data))
        if self.encoding == "json":
            return _json_encoder.encode(body) + self._json_end
        try:
            return self._pack(_msgpack_encoder.encode(body))
        except MSGPACK_REFUSES as exc:  # its data (a hosted server's error code, say)
            body.error.data = None
            body.error.message = f"{message} ({_NO_MSGPACK} for its data: {exc})"
            return self._pack(_msgpack_encoder.encode(body))

    def event(self, name: str, data: Any, request_id: RequestId | None = None) -> bytes:
        if self.encoding == "json":
            return (
                _json_encoder.encode(Event(event=name, data=data, id=request_id)) + self._json_end
            )
        try:
            body = _msgpack_encoder.encode(Event(event=name, data=_json_safe(data), id=request_id))
        except MSGPACK_REFUSES as exc:  # a sidecar's progress: told, not sent
            message = f"{_NO_MSGPACK} for the data of event {name}: {exc}"
            body = _msgpack_encoder.encode(
                Event(event=name, data={"error": message}, id=request_id)
            )
        return self._pack(body)
