"""The MCP client connection, sans-IO: handshake, pagination, calls, progress, cancellation,
server requests, notifications, breaches; input fed whole, byte by byte and with trailing data."""

import msgspec
import pytest

from supervisor.protocols import mcp as proto
from supervisor.protocols.errors import LineTooLong, ProtocolError

enc = msgspec.json.encode
dec = msgspec.json.decode


def line(obj):
    return enc(obj) + b"\n"


def result(rid, res):
    return line({"jsonrpc": "2.0", "id": rid, "result": res})


def feed_all(conn, data, mode="whole"):
    out = []
    if mode == "whole":
        out += conn.feed(data)
    elif mode == "bytes":
        for i in range(len(data)):
            out += conn.feed(data[i : i + 1])
    else:
        out += conn.feed(data[:9])
        out += conn.feed(data[9:])
    return out


INIT_RESULT = {
    "protocolVersion": "2025-11-25",
    "capabilities": {"tools": {"listChanged": True}},
    "serverInfo": {"name": "srv", "version": "1.2"},
}


def ready(version="2025-11-25"):
    c = proto.McpConnection(client_name="toolhost", client_version="9")
    rid, data = c.initialize()
    msg = dec(data)
    assert msg == {
        "jsonrpc": "2.0",
        "id": rid,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-11-25",
            "capabilities": {},
            "clientInfo": {"name": "toolhost", "version": "9"},
        },
    }
    (resp,) = c.feed(result(rid, {**INIT_RESULT, "protocolVersion": version}))
    assert resp == proto.Response(id=rid, method="initialize", result=resp.result)
    note = c.initialized(resp)
    assert dec(note) == {"jsonrpc": "2.0", "method": "notifications/initialized"}
    assert c.state == "ready" and c.protocol_version == version
    return c


@pytest.mark.parametrize("version", ["2025-11-25", "2025-06-18", "2024-11-05"])
def test_handshake_accepts_the_version_the_server_answers(version):
    c = ready(version)
    assert c.server.serverInfo.name == "srv" and c.server.capabilities.tools.listChanged


def test_initialize_error_and_bad_result():
    c = proto.McpConnection()
    rid, _ = c.initialize()
    (resp,) = c.feed(
        line({"jsonrpc": "2.0", "id": rid, "error": {"code": -32602, "message": "no"}})
    )
    with pytest.raises(proto.RequestFailed, match="initialize failed: no"):
        c.initialized(resp)
    c = proto.McpConnection()
    rid, _ = c.initialize()
    (resp,) = c.feed(result(rid, {"capabilities": {}}))
    with pytest.raises(ProtocolError, match="invalid initialize result"):
        c.initialized(resp)
    assert c.state == "error"


def test_nothing_but_ping_before_the_handshake():
    c = proto.McpConnection()
    with pytest.raises(ProtocolError):
        c.call_tool("x", msgspec.Raw(b"{}"))
    with pytest.raises(ProtocolError):
        c.list_tools()
    c.initialize()
    with pytest.raises(ProtocolError):
        c.initialize()


def test_tools_list_pagination():
    c = ready()
    rid, data = c.list_tools()
    assert dec(data)["params"] == {}
    tool = {
        "name": "get_time",
        "title": "Get time",
        "inputSchema": {"type": "object", "required": ["tz"]},
        "outputSchema": {"type": "object"},
        "annotations": {"readOnlyHint": True},
    }
    (resp,) = c.feed(result(rid, {"tools": [tool], "nextCursor": "page2"}))
    tools, cursor = proto.tools_page(resp)
    assert cursor == "page2"
    assert tools[0].name == "get_time" and tools[0].description == "Get time"
    assert tools[0].inputSchema["required"] == ["tz"] and tools[0].outputSchema == {
        "type": "object"
    }
    rid2, data = c.list_tools(cursor)
    assert dec(data)["params"] == {"cursor": "page2"} and rid2 == rid + 1
    (resp,) = c.feed(result(rid2, {"tools": [{"name": "b", "description": "B"}]}))
    tools, cursor = proto.tools_page(resp)
    assert cursor is None and tools[0].inputSchema == {"type": "object"}
    rid3, _ = c.list_tools()
    (resp,) = c.feed(line({"jsonrpc": "2.0", "id": rid3, "error": {"code": -1, "message": "x"}}))
    with pytest.raises(proto.RequestFailed):
        proto.tools_page(resp)


@pytest.mark.parametrize("mode", ["whole", "bytes", "split"])
def test_call_progress_and_answer_any_chunking(mode):
    c = ready()
    rid, data = c.call_tool("slow", msgspec.Raw(b'{"s":1}'), progress=True)
    msg = dec(data)
    assert msg["method"] == "tools/call"
    assert msg["params"] == {"name": "slow", "arguments": {"s": 1}, "_meta": {"progressToken": rid}}
    stream = (
        line(
            {
                "jsonrpc": "2.0",
                "method": "notifications/progress",
                "params": {"progressToken": rid, "progress": 1, "total": 2, "message": "half"},
            }
        )
        + result(rid, {"content": [{"type": "text", "text": "done"}]})
        + line(
            {
                "jsonrpc": "2.0",
                "method": "notifications/progress",
                "params": {"progressToken": rid, "progress": 2},
            }
        )
        + b'{"jsonrpc": "2.0", "method": "notifications/tools/list_'  # trailing partial line
    )
    events = feed_all(c, stream, mode)
    assert [type(e) for e in events] == [proto.Progress, proto.Response]
    assert dec(events[0].payload) == {"progress": 1, "total": 2, "message": "half"}
    assert events[0].id == rid
    assert proto.call_answer(events[1]).content == "done"
    assert c.feed(b'changed"}\n') == [proto.ToolsChanged()]


def test_no_progress_token_unless_asked():
    c = ready()
    _, data = c.call_tool("x", msgspec.Raw(b"{}"))
    assert "_meta" not in dec(data)["params"]


def test_cancel_then_late_answer_is_dropped():
    c = ready()
    rid, _ = c.call_tool("slow", msgspec.Raw(b"{}"), progress=True)
    note = dec(c.cancel(rid, "deadline"))
    assert note == {
        "jsonrpc": "2.0",
        "method": "notifications/cancelled",
        "params": {"requestId": rid, "reason": "deadline"},
    }
    assert c.cancel(rid, "again") == b""  # no longer pending: nothing to send
    late = line(
        {
            "jsonrpc": "2.0",
            "method": "notifications/progress",
            "params": {"progressToken": rid, "progress": 1},
        }
    ) + line({"jsonrpc": "2.0", "id": rid, "error": {"code": 0, "message": "Request cancelled"}})
    assert c.feed(late) == []
    assert c.state == "ready"


def test_answer_for_an_unknown_request_is_a_breach():
    c = ready()
    with pytest.raises(ProtocolError, match="unknown request 99"):
        c.feed(result(99, {}))
    assert c.state == "error"
    with pytest.raises(ProtocolError):
        c.feed(b"\n")


def test_junk_keeps_earlier_events_then_breaks():
    c = ready()
    rid, _ = c.ping()
    with pytest.raises(ProtocolError) as info:
        c.feed(result(rid, {}) + b"Starting server on stdio...\n")
    assert (
        "not a JSON-RPC message" in info.value.message and "Starting server" in info.value.message
    )
    assert [type(e) for e in info.value.accepted] == [proto.Response]


@pytest.mark.parametrize(
    "msg",
    [
        {"jsonrpc": "1.0", "id": 1, "result": {}},
        {"jsonrpc": "2.0"},
        {"jsonrpc": "2.0", "id": None, "error": {"code": -32700, "message": "Parse error"}},
    ],
)
def test_breaches(msg):
    c = ready()
    with pytest.raises(ProtocolError):
        c.feed(line(msg))


def test_line_limit():
    c = proto.McpConnection(max_line=50)
    with pytest.raises(LineTooLong):
        c.feed(b"x" * 60)


def test_server_requests_are_answered():
    c = ready()
    (reply,) = c.feed(line({"jsonrpc": "2.0", "id": "s1", "method": "ping"}))
    assert dec(reply.data) == {"jsonrpc": "2.0", "id": "s1", "result": {}}
    (reply,) = c.feed(
        line({"jsonrpc": "2.0", "id": 7, "method": "sampling/createMessage", "params": {}})
    )
    answer = dec(reply.data)
    assert answer["id"] == 7 and answer["error"]["code"] == -32601


def test_notifications():
    c = proto.McpConnection()
    c.initialize()
    changed = line({"jsonrpc": "2.0", "method": "notifications/tools/list_changed"})
    assert c.feed(changed) == []  # before ready: nothing to re-list yet
    c = ready()
    assert c.feed(changed) == [proto.ToolsChanged()]
    log = line(
        {
            "jsonrpc": "2.0",
            "method": "notifications/message",
            "params": {"level": "warning", "logger": "db", "data": {"n": 1}},
        }
    )
    assert c.feed(log) == [proto.Log(text='[warning db] {"n":1}')]
    resources = line({"jsonrpc": "2.0", "method": "notifications/resources/list_changed"})
    assert c.feed(resources) == [proto.ListChanged(kind="resources")]
    prompts = line({"jsonrpc": "2.0", "method": "notifications/prompts/list_changed"})
    assert c.feed(prompts) == [proto.ListChanged(kind="prompts")]
    updated = line(
        {"jsonrpc": "2.0", "method": "notifications/resources/updated", "params": {"uri": "a://b"}}
    )
    assert c.feed(updated) == [proto.ResourceUpdated(uri="a://b")]
    other = line({"jsonrpc": "2.0", "method": "notifications/roots/list_changed"})
    assert c.feed(other) == []
    assert c.feed(line({"jsonrpc": "2.0", "method": "ping"})) == []  # a notification: no answer


def test_batches_are_unpacked():
    c = ready()
    r1, _ = c.ping()
    r2, _ = c.ping()
    events = c.feed(
        enc(
            [{"jsonrpc": "2.0", "id": r1, "result": {}}, {"jsonrpc": "2.0", "id": r2, "result": {}}]
        )
        + b"\n"
    )
    assert [e.id for e in events] == [r1, r2]


def answer_of(res=None, error=None):
    return proto.call_answer(
        proto.Response(
            id=1,
            method="tools/call",
            result=msgspec.Raw(enc(res)) if res is not None else None,
            error=error,
        )
    )


def test_call_answer_structured_text_and_errors():
    a = answer_of(
        {"content": [{"type": "text", "text": '{"t": 1}'}], "structuredContent": {"t": 1}}
    )
    assert a.ok and dec(a.data) == {"t": 1} and a.content == '{"t": 1}'
    a = answer_of({"content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]})
    assert (
        a.ok
        and a.content == "a\nb"
        and dec(a.data) == [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    )
    a = answer_of({"content": [{"type": "image", "data": "AAAA", "mimeType": "image/png"}]})
    assert a.ok and a.content == "[image content: image/png]"
    a = answer_of({"content": [], "structuredContent": None})
    assert a.ok and a.content is None and dec(a.data) is None
    a = answer_of({"content": [{"type": "text", "text": "Invalid timezone"}], "isError": True})
    assert (a.ok, a.code, a.error) == (False, "failed", "Invalid timezone")
    assert dec(a.data)[0]["text"] == "Invalid timezone"  # data survives the failure
    a = answer_of({"isError": True})
    assert a.error == "the MCP tool reported an error"
    a = answer_of({"content": "not a list"})
    assert a.code == "protocol-error"


@pytest.mark.parametrize(
    ("code", "expected"), [(-32602, "invalid-input"), (-32601, "unsupported"), (-32000, "failed")]
)
def test_call_answer_rpc_errors(code, expected):
    from supervisor.contracts.mcp import RpcErrorInfo

    a = answer_of(error=RpcErrorInfo(code=code, message="Unknown tool: x", data={"d": 1}))
    assert (a.ok, a.code, a.error) == (False, expected, "Unknown tool: x")
    assert a.details == {"rpcCode": code, "rpcData": {"d": 1}}


BIG = "0123456789abcdef\n" * (proto.MEMBERS_FROM // 17 + 10)  # its line is past MEMBERS_FROM


@pytest.mark.parametrize("mode", ["whole", "split"])
def test_a_long_answer_comes_as_its_members_in_one_pass(mode):
    """A line past MEMBERS_FROM is decoded with its result's members each left as JSON (what
    the MCP face needs to stamp a read, without a second pass over 1 MiB); a short one keeps
    its result as one piece of JSON. Either way it is the JSON the server sent."""
    c = ready()
    read = {"contents": [{"uri": "blob://x", "text": BIG}], "_meta": {"k": 1}}
    rid, _ = c.ask("resources/read", {"uri": "blob://x"})
    (resp,) = feed_all(c, result(rid, read), mode)
    assert type(resp.result) is dict
    assert all(type(v) is msgspec.Raw for v in resp.result.values())
    assert {k: dec(v) for k, v in resp.result.items()} == read
    assert dec(proto.result_json(resp.result)) == read
    rid, _ = c.ask("resources/read", {"uri": "note://x"})
    (resp,) = feed_all(c, result(rid, {"contents": []}), mode)
    assert type(resp.result) is msgspec.Raw and dec(resp.result) == {"contents": []}


def test_a_long_answer_that_is_not_an_object_or_not_json():
    """Members only for an object: a long array result stays one piece of JSON; a long line
    that is not JSON-RPC is the same breach as a short one."""
    c = ready()
    rid, _ = c.ask("resources/read", {"uri": "blob://x"})
    (resp,) = c.feed(result(rid, [BIG]))
    assert type(resp.result) is msgspec.Raw and dec(resp.result) == [BIG]
    rid, _ = c.ask("resources/read", {"uri": "blob://x"})
    with pytest.raises(ProtocolError, match="not a JSON-RPC message"):
        c.feed(result(rid, {"text": BIG})[:-3] + b"\n")
    assert proto.result_json(None) == b"null"


def test_a_long_tools_call_answer_maps_like_a_short_one():
    """The host's typed decodes (a call's answer, a list page) read members like one piece."""
    c = ready()
    rid, _ = c.call_tool("t", msgspec.Raw(b"{}"))
    answer = {"content": [{"type": "text", "text": BIG}], "structuredContent": {"n": 1}}
    (resp,) = c.feed(result(rid, answer))
    assert type(resp.result) is dict
    outcome = proto.call_answer(resp)
    assert outcome.ok and outcome.content == BIG and dec(outcome.data) == {"n": 1}
    rid, _ = c.ask("resources/list", {})
    items = [{"uri": f"note://{i}", "name": BIG[:60]} for i in range(1200)]
    (resp,) = c.feed(result(rid, {"resources": items, "nextCursor": "n2"}))
    assert type(resp.result) is dict
    assert proto.list_page(resp, "resources") == (items, "n2")


def test_the_members_decoder_reads_every_field_of_a_message():
    """The long-line decoder is :class:`mcp.Incoming` with the result split: a field added to
    one and not the other would be dropped from long lines only."""
    fields = msgspec.structs.fields
    assert [f.name for f in fields(proto._IncomingMembers)] == [
        f.name for f in fields(proto.mcp.Incoming)
    ]
