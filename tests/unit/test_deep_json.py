"""JSON nested past the parser's recursion limit, from any worker or script, is a protocol
error or an unparsed answer: never a RecursionError escaping into the host (issue 23 found it)."""

import pytest

from supervisor.protocols import fractalic_discovery, fractalic_yaml, oneshot, simple_json
from supervisor.protocols.errors import ProtocolError
from supervisor.protocols.process_json import ProcessJsonConnection

DEEP = b"[" * 200_000 + b"]" * 200_000


def test_process_json_line_is_a_protocol_error():
    conn = ProcessJsonConnection()
    with pytest.raises(ProtocolError, match="invalid message"):
        conn.feed(b'{"type":"result","id":1,"ok":true,"data":' + DEEP + b"}\n")
    assert conn.state == "error"


def test_oneshot_and_simple_json_answers():
    answer = oneshot.parse_answer("t", b'{"ok":true,"x":' + DEEP + b"}", 0)
    assert not answer.ok and answer.code == "protocol-error"
    answer = simple_json.parse_answer("t", DEEP, 0)
    assert answer.ok and answer.content.startswith("[[[")
    answer = fractalic_yaml.parse_cli_answer("t", DEEP, 0)
    assert answer.ok and b'"result":"[[[[' in bytes(answer.data)
    assert simple_json.tool_info("t", DEEP, "fallback").description == "fallback"
    why = fractalic_discovery.parse_multi_schema(DEEP, ["s"], r"^\w+$", "s.py")
    assert why == "printed JSON nested too deeply"


def test_mcp_line_is_a_protocol_error():
    from supervisor.protocols.mcp import McpConnection

    conn = McpConnection()
    with pytest.raises(ProtocolError, match="not a JSON-RPC message"):
        conn.feed(b'{"jsonrpc":"2.0","id":1,"result":' + DEEP + b"}\n")


def test_kernel_codec_and_mcp_face_refuse_deep_frames():
    import msgspec

    from supervisor.protocols.mcp_server import McpServerConnection
    from supervisor.server.codec import BadFrame, BadParams, Codec

    with pytest.raises(BadFrame, match="nested too deeply"):
        Codec().request(b'{"id":1,"method":"m","params":' + DEEP + b"}")
    with pytest.raises(BadParams, match="nested too deeply"):
        Codec().params(msgspec.Raw(DEEP), list)
    conn = McpServerConnection()
    for message in (DEEP, b'{"jsonrpc":"2.0","id":1,"method":"x","params":' + DEEP + b"}"):
        (event,) = conn.receive(message)
        assert "error" in msgspec.json.decode(event.data)
