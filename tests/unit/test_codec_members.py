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
