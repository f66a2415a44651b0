"""The MCP client connection in both eras, sans-IO: ``server/discover`` first, the handshake as
the fallback on anything that is not a modern answer (an error, a handshake-only answer, a
result that is not a discover result, no answer in time); in the stateless era every request
carries the envelope, ``server/discover`` is the probe, ``subscriptions/listen`` brings list
changes and HTTP requests get their routing headers. Input fed whole, byte by byte, split."""

import msgspec
import pytest

from supervisor.contracts import mcp
from supervisor.protocols import mcp as proto
from supervisor.protocols import mcp_http
from supervisor.protocols.errors import ProtocolError

enc = msgspec.json.encode
dec = msgspec.json.decode
V = "2026-07-28"
ENVELOPE = {
    mcp.PROTOCOL_VERSION_KEY: V,
    mcp.CLIENT_INFO_KEY: {"name": "toolhost", "version": "9"},
    mcp.CLIENT_CAPABILITIES_KEY: {},
}
DISCOVERED = {
    "supportedVersions": [V],
    "capabilities": {"tools": {"listChanged": True}},
    "instructions": "hi",
    "ttlMs": 0,
    "cacheScope": "public",
    "resultType": "complete",
    "_meta": {mcp.SERVER_INFO_KEY: {"name": "modern-srv", "version": "3"}},
}


def line(obj):
    return enc(obj) + b"\n"


def feed(conn, data, mode):
    if mode == "whole":
        return conn.feed(data)
    if mode == "bytes":
        return [ev for i in range(len(data)) for ev in conn.feed(data[i : i + 1])]
    return conn.feed(data[:7]) + conn.feed(data[7:])


def probing():
    conn = proto.McpConnection(client_name="toolhost", client_version="9")
    rid, data = conn.discover()
    assert conn.state == "discovering" and conn.era is None
    assert dec(data) == {
        "jsonrpc": "2.0",
        "id": rid,
        "method": "server/discover",
        "params": {"_meta": ENVELOPE},
    }
    assert conn.http_headers(rid) == [
        ("MCP-Protocol-Version", V),
        ("Mcp-Method", "server/discover"),
    ]
    return conn, rid


@pytest.mark.parametrize("mode", ["whole", "bytes", "split"])
def test_a_modern_answer_makes_the_connection_ready_in_the_stateless_era(mode):
    conn, rid = probing()
    trailing = b'{"jsonrpc":"2.0","method":"notifications/message","params":{"data":"x"}'
    [resp] = feed(conn, line({"jsonrpc": "2.0", "id": rid, "result": DISCOVERED}) + trailing, mode)
    assert resp == proto.Response(id=rid, method="server/discover", result=resp.result)
    assert conn.discovered(resp) is True
    assert (conn.state, conn.era, conn.protocol_version) == ("ready", "modern", V)
    assert conn.server is not None
    assert conn.server.serverInfo == mcp.Implementation(name="modern-srv", version="3")
    assert conn.server.instructions == "hi"
    assert conn.http_headers(rid) == []  # answered: forgotten
    [log] = conn.feed(b"}\n")
    assert isinstance(log, proto.Log)


def modern():
    conn, rid = probing()
    [resp] = conn.feed(line({"jsonrpc": "2.0", "id": rid, "result": DISCOVERED}))
    assert conn.discovered(resp)
    return conn


def test_stateless_requests_carry_the_envelope_and_their_routing_headers():
    conn = modern()
    rid, data = conn.list_tools()
    assert dec(data)["params"] == {"_meta": ENVELOPE}
    assert conn.http_headers(rid) == [("MCP-Protocol-Version", V), ("Mcp-Method", "tools/list")]
    rid, data = conn.list_tools("c2")
    assert dec(data)["params"] == {"cursor": "c2", "_meta": ENVELOPE}

    rid, data = conn.call_tool("echo.say", msgspec.Raw(b'{"a":1}'), progress=True, traceparent="tp")
    assert dec(data)["params"] == {
        "name": "echo.say",
        "arguments": {"a": 1},
        "_meta": {"progressToken": rid, "traceparent": "tp", **ENVELOPE},
    }
    assert conn.http_headers(rid) == [
        ("MCP-Protocol-Version", V),
        ("Mcp-Method", "tools/call"),
        ("Mcp-Name", "echo.say"),
    ]
    rid, data = conn.call_tool("écho", msgspec.Raw(b"{}"))
    name = dict(conn.http_headers(rid))["Mcp-Name"]
    assert name.startswith("=?base64?") and mcp_http.decode_header_value(name) == "écho"
    assert conn.cancel(rid, "deadline") != b""
    assert conn.http_headers(rid) == []


def test_a_plain_stateless_call_is_the_sdk_clients_line_byte_for_byte():
    """What a hosted SDK server reads per call (bench/README.md, branch ``s7-mcp``): the
    official client's ``tools/call`` line with only ``clientInfo`` differing - the envelope and
    nothing else in ``_meta`` (no progress token, no traceparent), one line."""
    conn = modern()
    rid, data = conn.call_tool("gw_echo", msgspec.Raw(b'{"payload":"xx"}'))
    sdk = (
        b'{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"gw_echo",'
        b'"arguments":{"payload":"xx"},"_meta":{"io.modelcontextprotocol/protocolVersion":'
        b'"2026-07-28","io.modelcontextprotocol/clientInfo":{"name":"mcp","version":"0.1.0"},'
        b'"io.modelcontextprotocol/clientCapabilities":{}}}}\n'
    ) % rid  # as the official SDK client wrote it (mcp 0.1.0), captured on the server's stdin
    ours = sdk.replace(b'{"name":"mcp","version":"0.1.0"}', b'{"name":"toolhost","version":"9"}')
    assert data == ours
    assert data.count(b"\n") == 1
    # The envelope is built once per session: the next call's line differs only in its id.
    rid2, data2 = conn.call_tool("gw_echo", msgspec.Raw(b'{"payload":"xx"}'))
    assert data2 == ours.replace(b'"id":%d,' % rid, b'"id":%d,' % rid2)


def test_the_probe_and_list_changes_of_the_stateless_era():
    conn = modern()
    rid, data = conn.probe()
    assert dec(data) == {
        "jsonrpc": "2.0",
        "id": rid,
        "method": "server/discover",
        "params": {"_meta": ENVELOPE},
    }
    [resp] = conn.feed(line({"jsonrpc": "2.0", "id": rid, "result": DISCOVERED}))
    assert resp.method == "server/discover" and conn.state == "ready"

    lid, data = conn.listen()
    assert dec(data)["params"] == {"notifications": {"toolsListChanged": True}, "_meta": ENVELOPE}
    tag = {"_meta": {mcp.SUBSCRIPTION_ID_KEY: lid}}
    events = conn.feed(
        line(
            {
                "jsonrpc": "2.0",
                "method": "notifications/subscriptions/acknowledged",
                "params": {"notifications": {"toolsListChanged": True}, **tag},
            }
        )
        + line({"jsonrpc": "2.0", "method": "notifications/tools/list_changed", "params": tag})
    )
    assert events == [proto.ToolsChanged()]
    # The stream's end is the answer to the listen request: the runtime listens again.
    [end] = conn.feed(line({"jsonrpc": "2.0", "id": lid, "result": {"resultType": "complete"}}))
    assert end.method == "subscriptions/listen"


def test_the_handshake_era_is_unchanged_and_has_no_listen():
    conn = proto.McpConnection()
    rid, _ = conn.initialize()
    init = {"protocolVersion": "2025-11-25", "capabilities": {}, "serverInfo": {"name": "s"}}
    [resp] = conn.feed(line({"jsonrpc": "2.0", "id": rid, "result": init}))
    conn.initialized(resp)
    assert conn.era == "handshake"
    rid, data = conn.call_tool("t", msgspec.Raw(b"{}"))
    assert dec(data)["params"] == {"name": "t", "arguments": {}}
    assert conn.http_headers(rid) == []
    rid, data = conn.probe()
    assert dec(data)["method"] == "ping"
    with pytest.raises(ProtocolError, match="stateless era"):
        conn.listen()


NOT_MODERN = [
    pytest.param({"error": {"code": -32601, "message": "Method not found"}}, id="unknown-method"),
    pytest.param({"error": {"code": -32600, "message": "initialize first"}}, id="before-init"),
    pytest.param({"error": {"code": -32603, "message": "boom", "data": [1]}}, id="internal"),
    pytest.param(
        {"error": {"code": -32022, "message": "no", "data": {"supported": ["2025-11-25"]}}},
        id="handshake-only-32022",
    ),
    pytest.param(
        {"error": {"code": -32022, "message": "no", "data": "garbled"}}, id="garbled-32022"
    ),
    pytest.param(
        {"result": {**DISCOVERED, "supportedVersions": ["2025-06-18"]}}, id="handshake-versions"
    ),
    pytest.param({"result": {"tools": []}}, id="not-a-discover-result"),
    pytest.param({"result": None}, id="null"),
]


@pytest.mark.parametrize("answer", NOT_MODERN)
def test_anything_but_a_modern_answer_falls_back_to_the_handshake(answer):
    conn, rid = probing()
    [resp] = conn.feed(line({"jsonrpc": "2.0", "id": rid, **answer}))
    assert conn.discovered(resp) is False
    assert (conn.state, conn.era) == ("new", None)
    rid, data = conn.initialize()  # the handshake, exactly as before
    assert dec(data)["method"] == "initialize"
    assert "_meta" not in dec(data)["params"]
    init = {"protocolVersion": "2025-06-18", "capabilities": {}, "serverInfo": {"name": "old"}}
    [resp] = conn.feed(line({"jsonrpc": "2.0", "id": rid, "result": init}))
    assert conn.initialized(resp) == line({"jsonrpc": "2.0", "method": "notifications/initialized"})
    assert (conn.state, conn.era, conn.protocol_version) == ("ready", "handshake", "2025-06-18")


def test_no_answer_in_time_falls_back_and_a_late_answer_is_dropped():
    conn, rid = probing()
    conn.abandon_discover()
    assert conn.state == "new" and rid not in conn.pending
    irid, _ = conn.initialize()
    late = line({"jsonrpc": "2.0", "id": rid, "result": DISCOVERED})
    init = {"protocolVersion": "2025-11-25", "capabilities": {}}
    events = conn.feed(late + line({"jsonrpc": "2.0", "id": irid, "result": init}))
    assert [e.method for e in events] == ["initialize"]  # the late discover answer: dropped
    conn.initialized(events[0])
    assert conn.era == "handshake"
    conn.abandon_discover()  # harmless once past it
    assert conn.state == "ready"


def test_a_late_discover_answer_wins_when_the_handshake_is_refused():
    """A server slow to start reads the discover the host gave up on and the initialize that
    followed, answers the first (stateless) and refuses the second: the session is stateless."""
    conn, rid = probing()
    conn.abandon_discover()
    irid, _ = conn.initialize()
    late = line({"jsonrpc": "2.0", "id": rid, "result": DISCOVERED})
    refused = {"code": -32022, "message": "use server/discover", "data": {"supported": [V]}}
    events = conn.feed(late + line({"jsonrpc": "2.0", "id": irid, "error": refused}))
    assert [e.method for e in events] == ["initialize"]
    assert events[0].error is not None
    assert conn.take_late_discovery() is True
    assert (conn.state, conn.era, conn.protocol_version) == ("ready", "modern", V)
    assert conn.server is not None and conn.server.serverInfo.name == "modern-srv"
    assert conn.take_late_discovery() is False  # taken once


def test_a_refused_handshake_without_a_late_discover_answer_stays_a_failure():
    conn, _ = probing()
    conn.abandon_discover()
    irid, _ = conn.initialize()
    refused = {"code": -32600, "message": "no"}
    [resp] = conn.feed(line({"jsonrpc": "2.0", "id": irid, "error": refused}))
    assert conn.take_late_discovery() is False
    with pytest.raises(proto.RequestFailed):
        conn.initialized(resp)
    # a late answer that names no revision of ours does not rescue it either
    conn2, rid2 = probing()
    conn2.abandon_discover()
    irid2, _ = conn2.initialize()
    old = line({"jsonrpc": "2.0", "id": rid2, "error": {"code": -32601, "message": "unknown"}})
    conn2.feed(old + line({"jsonrpc": "2.0", "id": irid2, "error": refused}))
    assert conn2.take_late_discovery() is False and conn2.state == "initializing"


def test_a_server_with_no_revision_in_common_is_a_start_failure():
    conn, rid = probing()
    error = {"code": -32022, "message": "no", "data": {"supported": ["2030-01-01"]}}
    [resp] = conn.feed(line({"jsonrpc": "2.0", "id": rid, "error": error}))
    with pytest.raises(proto.RequestFailed, match="server/discover failed"):
        conn.discovered(resp)
    assert conn.state == "error"


def test_discover_only_from_new_and_no_requests_while_discovering():
    conn, _ = probing()
    with pytest.raises(ProtocolError):
        conn.discover()
    with pytest.raises(ProtocolError):
        conn.list_tools()
    with pytest.raises(ProtocolError):
        conn.initialize()  # discovered() or abandon_discover() first


def test_routing_headers_replace_the_version_header_over_http():
    endpoint = mcp_http.parse_url("http://127.0.0.1:9/mcp")
    route = [("MCP-Protocol-Version", V), ("Mcp-Method", "tools/list")]
    headers = mcp_http.request_headers(
        endpoint, session=None, version=V, extra=[("X-A", "1")], body=b"{}", routing=route
    )
    assert [h for h in headers if h[0].lower().startswith("mcp")] == route
    assert headers[-1] == ("X-A", "1")
    plain = mcp_http.request_headers(
        endpoint, session="s", version="2025-11-25", extra=[], body=b""
    )
    assert ("MCP-Protocol-Version", "2025-11-25") in plain and ("Mcp-Session-Id", "s") in plain
    assert mcp_http.encode_header_value("plain.name") == "plain.name"
    assert mcp_http.encode_header_value(" edge") != " edge"
    assert mcp_http.decode_header_value(mcp_http.encode_header_value(" edge")) == " edge"
