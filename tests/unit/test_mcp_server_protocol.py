"""The sans-IO server side of MCP (``toolhost mcp``): lifecycle, errors, result mapping."""

import json

import msgspec
import pytest

from supervisor.contracts.envelope import Envelope, ErrorInfo, Meta
from supervisor.protocols.errors import LineTooLong
from supervisor.protocols.mcp_results import call_result, progress_fields
from supervisor.protocols.mcp_server import (
    Accepted,
    CallTool,
    Cancelled,
    ListTools,
    McpServerConnection,
    Reply,
    negotiate,
)


def line(obj) -> bytes:
    return json.dumps(obj).encode() + b"\n"


def init(version="2025-11-25", rid=1):
    return line(
        {
            "jsonrpc": "2.0",
            "id": rid,
            "method": "initialize",
            "params": {"protocolVersion": version, "capabilities": {}, "clientInfo": {"name": "t"}},
        }
    )


def answer(ev) -> dict:
    assert isinstance(ev, Reply)
    return json.loads(ev.data)


def ready() -> McpServerConnection:
    conn = McpServerConnection(server_version="9")
    [ev] = conn.feed(init())
    assert ev.initialized
    return conn


@pytest.mark.parametrize(
    ("asked", "got"),
    [
        ("2025-11-25", "2025-11-25"),
        ("2025-06-18", "2025-06-18"),
        ("2024-11-05", "2024-11-05"),
        ("2026-07-28", "2025-11-25"),
        ("bogus", "2025-11-25"),
    ],
)
def test_version_negotiation(asked, got):
    assert negotiate(asked) == got
    conn = McpServerConnection()
    [ev] = conn.feed(init(asked))
    result = answer(ev)["result"]
    assert result["protocolVersion"] == got
    assert result["capabilities"] == {
        "tools": {"listChanged": True},
        "resources": {"subscribe": True, "listChanged": True},
        "prompts": {"listChanged": True},
        "completions": {},
    }
    assert result["serverInfo"]["name"] == "toolhost"


def test_requests_before_initialize_are_refused_but_ping_works():
    conn = McpServerConnection()
    [ev] = conn.feed(line({"jsonrpc": "2.0", "id": 5, "method": "tools/list"}))
    assert answer(ev)["error"]["code"] == -32600
    assert "initialize" in answer(ev)["error"]["message"]
    [ev] = conn.feed(line({"jsonrpc": "2.0", "id": 6, "method": "ping"}))
    assert answer(ev) == {"jsonrpc": "2.0", "id": 6, "result": {}}


def test_split_lines_and_events():
    conn = ready()
    data = line({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}) + line(
        {
            "jsonrpc": "2.0",
            "id": "c",
            "method": "tools/call",
            "params": {
                "name": "echo.say",
                "arguments": {"text": "hi"},
                "_meta": {"progressToken": 7},
            },
        }
    )
    assert conn.feed(data[:10]) == []
    events = conn.feed(data[10:])
    assert events[0] == ListTools(id=2)
    call = events[1]
    assert isinstance(call, CallTool)
    assert (call.id, call.name, call.progress_token) == ("c", "echo.say", 7)
    assert json.loads(bytes(call.arguments)) == {"text": "hi"}


def test_call_without_arguments_gets_an_empty_object():
    conn = ready()
    [ev] = conn.feed(
        line({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "x"}})
    )
    assert bytes(ev.arguments) == b"{}"


@pytest.mark.parametrize(
    ("msg", "code"),
    [
        ({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"arguments": {}}}, -32602),
        (
            {
                "jsonrpc": "2.0",
                "id": 3,
                "method": "tools/call",
                "params": {"name": "x", "arguments": [1]},
            },
            -32602,
        ),
        ({"jsonrpc": "2.0", "id": 3, "method": "logging/setLevel"}, -32601),
        ({"jsonrpc": "1.0", "id": 3, "method": "ping"}, -32600),
        ({"jsonrpc": "2.0", "id": None, "method": "ping"}, -32600),
    ],
)
def test_bad_requests_get_json_rpc_errors(msg, code):
    conn = ready()
    [ev] = conn.feed(line(msg))
    assert answer(ev)["error"]["code"] == code


def test_not_json_is_a_parse_error_and_the_connection_goes_on():
    conn = ready()
    [ev] = conn.feed(b"{nope\n")
    assert answer(ev) == {
        "jsonrpc": "2.0",
        "id": None,
        "error": {"code": -32700, "message": answer(ev)["error"]["message"]},
    }
    [ev] = conn.feed(line({"jsonrpc": "2.0", "id": 9, "method": "ping"}))
    assert answer(ev)["result"] == {}


def test_notifications_cancel_and_batches():
    conn = ready()
    events = conn.receive(
        json.dumps(
            [
                {"jsonrpc": "2.0", "method": "notifications/initialized"},
                {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 4}},
                {"jsonrpc": "2.0", "id": 99, "result": {}},
            ]
        ).encode()
    )
    assert events == [Accepted(), Cancelled(id=4, reason=None), Accepted()]
    [ev] = conn.receive(b"[]")
    assert answer(ev)["error"]["code"] == -32600


def test_oversized_line_raises():
    conn = McpServerConnection(max_line=64)
    with pytest.raises(LineTooLong):
        conn.feed(b"x" * 100)


def test_outgoing_messages():
    conn = ready()
    assert json.loads(conn.progress(7, 2.0, None, "half")) == {
        "jsonrpc": "2.0",
        "method": "notifications/progress",
        "params": {"progressToken": 7, "progress": 2.0, "message": "half"},
    }
    assert json.loads(conn.tools_changed()) == {
        "jsonrpc": "2.0",
        "method": "notifications/tools/list_changed",
    }


def test_progress_fields():
    assert progress_fields({"progress": 3, "total": 10, "message": "m"}, 1) == (3.0, 10.0, "m")
    assert progress_fields({"step": 1}, 4) == (4.0, None, '{"step":1}')
    assert progress_fields("text", 2) == (2.0, None, "text")


def _mcp(result: dict) -> dict:
    """What the client reads: the result as JSON, decoded."""
    return msgspec.json.decode(msgspec.json.encode(result))


def test_call_result_success_and_failure():
    ok = call_result(
        Envelope(
            status="success",
            tool="t",
            content="hi",
            data=msgspec.Raw(b'{"a": 1}'),
            meta=Meta(pid=3, durationMs=1.5),
        )
    )
    assert _mcp(ok) == {
        "content": [{"type": "text", "text": "hi"}],
        "structuredContent": {"a": 1},
        "isError": False,
        "_meta": {"toolhost": {"status": "success", "pid": 3, "durationMs": 1.5}},
    }
    scalar = call_result(Envelope(status="success", tool="t", content="5", data=msgspec.Raw(b"5")))
    assert _mcp(scalar)["structuredContent"] == {"result": 5}
    listed = call_result(
        Envelope(status="success", tool="t", content="", data=msgspec.Raw(b' \n [1, {"b": 2}]'))
    )
    assert _mcp(listed)["structuredContent"] == {"result": [1, {"b": 2}]}
    spaced = call_result(
        Envelope(status="success", tool="t", content="", data=msgspec.Raw(b'\t {"c": []} '))
    )
    assert _mcp(spaced)["structuredContent"] == {"c": []}
    for nothing in (b"null", b"  null\n", b""):
        none = call_result(
            Envelope(status="success", tool="t", content="x", data=msgspec.Raw(nothing))
        )
        assert "structuredContent" not in _mcp(none), nothing
    failed = call_result(
        Envelope(
            status="unavailable",
            tool="t",
            content="needs approval",
            error=ErrorInfo(code="approval-required", message="needs approval"),
        )
    )
    got = _mcp(failed)
    assert got["isError"] is True
    assert got["content"][0]["text"] == "[approval-required] needs approval"
    assert got["structuredContent"] == {
        "status": "unavailable",
        "error": {"code": "approval-required", "message": "needs approval"},
    }
    assert got["_meta"] == {"toolhost": {"status": "unavailable"}}  # defaults left out
    with_data = call_result(
        Envelope(
            status="failed",
            tool="t",
            content="boom",
            data=msgspec.Raw(b'{"partial": true}'),
            error=ErrorInfo(code="", message=""),
        )
    )
    got = _mcp(with_data)
    assert got["content"][0]["text"] == "[failed] boom"  # no code: the status; no message: content
    assert got["structuredContent"]["data"] == {"partial": True}
