"""A hosted server's long answer reaches a kernel as its members (each left as JSON): a JSON
connection writes them as they are, a MessagePack one decodes each; a result with no JSON in it
is encoded as it is, not walked."""

import msgspec

from supervisor.server import codec as codec_module
from supervisor.server.codec import Codec

MEMBERS = {
    "contents": msgspec.Raw(b'[{"uri":"blob://x","text":"abc"}]'),
    "_meta": msgspec.Raw(b'{"k":1}'),
}
PLAIN = {"resources": [{"uri": "note://a"}], "nested": {"deep": {"n": 1}}}


def _body(codec: Codec, frame: bytes) -> object:
    if codec.encoding == "json":
        return msgspec.json.decode(frame)
    return msgspec.msgpack.decode(frame[4:])  # past the length prefix


def test_members_reach_json_and_msgpack_connections_alike():
    for encoding in ("json", "msgpack"):
        codec = Codec(encoding)
        got = _body(codec, codec.response(7, MEMBERS))
        assert got == {
            "id": 7,
            "result": {"contents": [{"uri": "blob://x", "text": "abc"}], "_meta": {"k": 1}},
        }
        assert _body(codec, codec.response(8, PLAIN)) == {"id": 8, "result": PLAIN}


def test_a_result_with_no_json_in_it_is_not_walked():
    assert codec_module._json_safe(PLAIN) is PLAIN
    assert codec_module._json_safe(msgspec.Raw(b"")) is None


def test_json_with_no_msgpack_form_is_an_error_on_msgpack_and_passes_on_json():
    """An integer over 64 bits is valid JSON (a sidecar may send it) and has no MessagePack
    form: the response is the error ``internal`` saying so, an error's data and an event's data
    are replaced by why; nothing raises (it would end the task answering)."""
    big = msgspec.Raw(b'{"n":1000000000000000000000000000000}')
    packed, plain = Codec("msgpack"), Codec("json")
    answer = _body(packed, packed.response(3, {"contents": msgspec.Raw(b"[]"), "_meta": big}))
    assert answer["id"] == 3 and answer["error"]["code"] == "internal"  # type: ignore[index]
    assert "no MessagePack form" in answer["error"]["message"]  # type: ignore[index]
    assert _body(plain, plain.response(3, {"_meta": big})) == {
        "id": 3,
        "result": {"_meta": {"n": 10**30}},
    }
    error = _body(packed, packed.error(4, "failed", "s: boom", {"rpcCode": 10**30}))
    assert error == {
        "id": 4,
        "error": {"code": "failed", "message": error["error"]["message"]},  # type: ignore[index]
    }
    assert error["error"]["message"].startswith("s: boom (no MessagePack form")  # type: ignore[index]
    event = _body(packed, packed.event("tool.progress", big, 5))
    assert event["event"] == "tool.progress" and event["id"] == 5  # type: ignore[index]
    assert "no MessagePack form" in event["data"]["error"]  # type: ignore[index]
    assert _body(packed, packed.response(6, {"_meta": msgspec.Raw(b'{"n":1}')})) == {
        "id": 6,
        "result": {"_meta": {"n": 1}},
    }
