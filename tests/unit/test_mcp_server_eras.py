"""The sans-IO server side of MCP in both eras: the first request picks the era; the stateless
2026-07-28 era checks every request on its own (envelope, HTTP headers, revision) and shapes its
results (``resultType``, cache hints, the ``serverInfo`` stamp); listen streams; whole input,
byte by byte and with trailing data."""

import base64
import json

import msgspec
import pytest

from supervisor.contracts import mcp
from supervisor.protocols.mcp_http import decode_header_value
from supervisor.protocols.mcp_server import (
    HTTP_STATUS,
    CallTool,
    Forward,
    Listen,
    ListTools,
    McpServerConnection,
    Reply,
    duplicated_routing_header,
    honored,
    wants,
)

V = "2026-07-28"
ENVELOPE = {
    mcp.PROTOCOL_VERSION_KEY: V,
    mcp.CLIENT_CAPABILITIES_KEY: {},
    mcp.CLIENT_INFO_KEY: {"name": "sdk", "version": "2.3"},
}


def line(obj) -> bytes:
    return json.dumps(obj).encode() + b"\n"


def request(rid, method, params=None, meta=ENVELOPE) -> dict:
    p = dict(params or {})
    if meta is not None:
        p["_meta"] = {**p.get("_meta", {}), **meta}
    return {"jsonrpc": "2.0", "id": rid, "method": method, "params": p}


def answer(ev) -> dict:
    assert isinstance(ev, Reply)
    return json.loads(ev.data)


def discovered() -> McpServerConnection:
    conn = McpServerConnection(server_version="9")
    [ev] = conn.feed(line(request(1, "server/discover")))
    assert answer(ev)["result"]["supportedVersions"] == [V]
    return conn


def test_discover_picks_the_stateless_era_and_says_what_we_serve():
    conn = McpServerConnection(server_version="9", instructions="use me")
    [ev] = conn.feed(line(request(1, "server/discover")))
    assert conn.era == "modern" and conn.state == "ready"
    assert conn.protocol_version == V
    assert conn.client == mcp.Implementation(name="sdk", version="2.3")
    assert answer(ev) == {
        "jsonrpc": "2.0",
        "id": 1,
        "result": {
            "supportedVersions": [V],
            "capabilities": {
                "tools": {"listChanged": True},
                "resources": {"subscribe": True, "listChanged": True},
                "prompts": {"listChanged": True},
                "completions": {},
            },
            "ttlMs": 0,
            "cacheScope": "public",
            "instructions": "use me",
            "resultType": "complete",
            "_meta": {mcp.SERVER_INFO_KEY: {"name": "toolhost", "version": "9"}},
        },
    }


def test_a_bare_discover_is_answered_too():
    """A probe without the envelope still learns our revisions."""
    conn = McpServerConnection()
    [ev] = conn.feed(line({"jsonrpc": "2.0", "id": 1, "method": "server/discover"}))
    assert answer(ev)["result"]["supportedVersions"] == [V]
    assert conn.era == "modern"


def test_an_enveloped_first_request_picks_the_stateless_era_without_discover():
    conn = McpServerConnection()
    [ev] = conn.feed(line(request(4, "tools/list")))
    assert ev == ListTools(id=4)
    assert conn.era == "modern"


def test_initialize_picks_the_handshake_era_and_results_keep_their_shape():
    conn = McpServerConnection()
    init = {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "c"}}
    [ev] = conn.feed(line({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": init}))
    assert ev.initialized and conn.era == "handshake"
    assert json.loads(conn.tools_page(2, [{"name": "a"}])) == {
        "jsonrpc": "2.0",
        "id": 2,
        "result": {"tools": [{"name": "a"}]},
    }
    assert json.loads(conn.result(3, {"content": []})) == {
        "jsonrpc": "2.0",
        "id": 3,
        "result": {"content": []},
    }
    # A handshake client is never asked for the envelope.
    [ev] = conn.feed(
        line({"jsonrpc": "2.0", "id": 4, "method": "tools/call", "params": {"name": "a"}})
    )
    assert isinstance(ev, CallTool)


def test_stateless_results_carry_result_type_cache_hints_and_the_stamp():
    conn = discovered()
    page = json.loads(conn.tools_page(2, [{"name": "a"}]))["result"]
    assert page == {
        "tools": [{"name": "a"}],
        "ttlMs": 0,
        "cacheScope": "private",
        "resultType": "complete",
        "_meta": {mcp.SERVER_INFO_KEY: {"name": "toolhost", "version": "9"}},
    }
    called = json.loads(conn.result(3, {"content": [], "_meta": {"toolhost": {"pid": 1}}}))
    assert called["result"]["resultType"] == "complete"
    assert called["result"]["_meta"] == {
        "toolhost": {"pid": 1},
        mcp.SERVER_INFO_KEY: {"name": "toolhost", "version": "9"},
    }


@pytest.mark.parametrize(
    ("meta", "code", "words"),
    [
        (None, mcp.INVALID_PARAMS, "envelope"),
        ({mcp.PROTOCOL_VERSION_KEY: V}, mcp.INVALID_PARAMS, "clientCapabilities"),
        ({**ENVELOPE, mcp.PROTOCOL_VERSION_KEY: 7}, mcp.INVALID_PARAMS, "string"),
        ({**ENVELOPE, mcp.PROTOCOL_VERSION_KEY: "2030-01-01"}, mcp.UNSUPPORTED_VERSION, "2030"),
    ],
)
def test_every_stateless_request_is_checked_on_its_own(meta, code, words):
    conn = discovered()
    msg = request(5, "tools/call", {"name": "x", "arguments": {}}, meta=meta)
    [ev] = conn.feed(line(msg))
    error = answer(ev)["error"]
    assert (error["code"], ev.code) == (code, code)
    assert words in error["message"]
    if code == mcp.UNSUPPORTED_VERSION:
        assert error["data"] == {"supported": [V], "requested": "2030-01-01"}
    # The connection goes on: the next good request passes.
    [ev] = conn.feed(line(request(6, "tools/list")))
    assert ev == ListTools(id=6)


def test_initialize_on_a_stateless_connection_names_what_it_speaks():
    conn = discovered()
    init = {"protocolVersion": "2025-11-25", "capabilities": {}}
    [ev] = conn.feed(line({"jsonrpc": "2.0", "id": 2, "method": "initialize", "params": init}))
    error = answer(ev)["error"]
    assert error["code"] == mcp.UNSUPPORTED_VERSION
    assert error["data"] == {"supported": [V], "requested": "2025-11-25"}
    assert conn.era == "modern"


def test_a_preset_era_needs_no_first_request():
    """An HTTP request naming the revision in its header gets a connection in that era."""
    conn = McpServerConnection(era="modern")
    [ev] = conn.receive(json.dumps(request(1, "tools/list")).encode())
    assert ev == ListTools(id=1)
    [ev] = conn.receive(json.dumps({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}).encode())
    assert answer(ev)["error"]["code"] == mcp.INVALID_PARAMS


HEADERS = {"mcp-protocol-version": V, "mcp-method": "tools/call", "mcp-name": "echo.say"}


@pytest.mark.parametrize(
    ("headers", "ok"),
    [
        (HEADERS, True),
        (
            {**HEADERS, "mcp-name": "=?base64?" + base64.b64encode(b"echo.say").decode() + "?="},
            True,
        ),
        ({k: v for k, v in HEADERS.items() if k != "mcp-protocol-version"}, False),
        ({**HEADERS, "mcp-protocol-version": "2025-11-25"}, False),
        ({**HEADERS, "mcp-method": "tools/list"}, False),
        ({k: v for k, v in HEADERS.items() if k != "mcp-method"}, False),
        ({**HEADERS, "mcp-name": "echo.other"}, False),
        ({k: v for k, v in HEADERS.items() if k != "mcp-name"}, False),
        ({**HEADERS, "mcp-name": "=?base64?not base64?="}, False),
    ],
)
def test_http_routing_headers_must_agree_with_the_body(headers, ok):
    conn = McpServerConnection(era="modern")
    body = json.dumps(request(3, "tools/call", {"name": "echo.say", "arguments": {"t": 1}}))
    [ev] = conn.receive(body.encode(), headers)
    if ok:
        assert isinstance(ev, CallTool) and ev.name == "echo.say"
        assert bytes(ev.arguments) == b'{"t":1}' or json.loads(bytes(ev.arguments)) == {"t": 1}
    else:
        assert answer(ev)["error"]["code"] == mcp.HEADER_MISMATCH
        assert HTTP_STATUS[ev.code] == 400


def test_the_header_check_runs_before_the_revision_check():
    """A client that disagrees with itself is told so, not that its revision is unknown."""
    conn = McpServerConnection(era="modern")
    meta = {**ENVELOPE, mcp.PROTOCOL_VERSION_KEY: "2030-01-01"}
    body = json.dumps(request(1, "tools/list", meta=meta)).encode()
    [ev] = conn.receive(body, {"mcp-protocol-version": V, "mcp-method": "tools/list"})
    assert answer(ev)["error"]["code"] == mcp.HEADER_MISMATCH


def test_duplicated_routing_headers_and_header_values():
    assert duplicated_routing_header([(b"Mcp-Method", b"a"), (b"mcp-method", b"b")]) == "mcp-method"
    assert duplicated_routing_header([(b"Mcp-Method", b"a"), (b"Mcp-Name", b"b")]) is None
    assert decode_header_value("plain") == "plain"
    assert decode_header_value(None) is None
    wrapped = "=?base64?" + base64.b64encode("naïve".encode()).decode() + "?="
    assert decode_header_value(wrapped) == "naïve"
    assert decode_header_value("=?base64?!!?=") is None


def test_progress_and_trace_ride_in_the_same_meta_as_the_envelope():
    conn = discovered()
    meta = {
        **ENVELOPE,
        "progressToken": "p1",
        "traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01",
    }
    [ev] = conn.feed(line(request(7, "tools/call", {"name": "a"}, meta=meta)))
    assert isinstance(ev, CallTool)
    assert ev.progress_token == "p1" and ev.traceparent is not None
    assert bytes(ev.arguments) == b"{}"


def test_listen_is_acknowledged_with_what_is_honored_and_changes_are_tagged():
    conn = discovered()
    wanted = {"toolsListChanged": True, "promptsListChanged": True, "resourceSubscriptions": ["a"]}
    [ev] = conn.feed(line(request("listen-1", "subscriptions/listen", {"notifications": wanted})))
    assert isinstance(ev, Listen) and ev.id == "listen-1"
    shown = honored(ev.wanted)
    assert json.loads(conn.listen_ack(ev.id, shown)) == {
        "jsonrpc": "2.0",
        "method": "notifications/subscriptions/acknowledged",
        "params": {
            "notifications": {
                "toolsListChanged": True,
                "promptsListChanged": True,
                "resourceSubscriptions": ["a"],
            },
            "_meta": {mcp.SUBSCRIPTION_ID_KEY: "listen-1"},
        },
    }
    assert json.loads(conn.tools_changed("listen-1")) == {
        "jsonrpc": "2.0",
        "method": "notifications/tools/list_changed",
        "params": {"_meta": {mcp.SUBSCRIPTION_ID_KEY: "listen-1"}},
    }
    assert json.loads(conn.list_changed("prompts", "listen-1")) == {
        "jsonrpc": "2.0",
        "method": "notifications/prompts/list_changed",
        "params": {"_meta": {mcp.SUBSCRIPTION_ID_KEY: "listen-1"}},
    }
    assert json.loads(conn.resource_updated("a", "listen-1")) == {
        "jsonrpc": "2.0",
        "method": "notifications/resources/updated",
        "params": {"uri": "a", "_meta": {mcp.SUBSCRIPTION_ID_KEY: "listen-1"}},
    }
    assert wants(shown, "prompts") and wants(shown, "tools") and not wants(shown, "resources")
    # Nothing asked, nothing honored (what we never send is not acknowledged).
    assert honored(mcp.SubscriptionFilter()) == mcp.SubscriptionFilter()


def test_resources_subscribe_is_forwarded_in_the_handshake_era_only():
    conn = McpServerConnection()
    init = {"protocolVersion": "2025-11-25", "capabilities": {}}
    conn.feed(line({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": init}))
    sub = {"jsonrpc": "2.0", "id": 2, "method": "resources/subscribe", "params": {"uri": "a://b"}}
    [ev] = conn.feed(line(sub))
    assert isinstance(ev, Forward) and ev.kernel == "resources.subscribe"
    assert ev.params == {"uri": "a://b"}
    assert json.loads(conn.resource_updated("a://b")) == {
        "jsonrpc": "2.0",
        "method": "notifications/resources/updated",
        "params": {"uri": "a://b"},
    }
    modern = discovered()
    [ev] = modern.feed(line(request(3, "resources/subscribe", {"uri": "a://b"})))
    assert answer(ev)["error"]["code"] == mcp.METHOD_NOT_FOUND


def test_listen_needs_the_stateless_era():
    conn = McpServerConnection()
    init = {"protocolVersion": "2025-11-25", "capabilities": {}}
    conn.feed(line({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": init}))
    [ev] = conn.feed(line({"jsonrpc": "2.0", "id": 2, "method": "subscriptions/listen"}))
    assert answer(ev)["error"]["code"] == mcp.METHOD_NOT_FOUND
    assert HTTP_STATUS[mcp.METHOD_NOT_FOUND] == 404


def test_a_session_fed_whole_byte_by_byte_and_with_trailing_data_gives_the_same_events():
    data = (
        line(request(1, "server/discover"))
        + line(request(2, "tools/list"))
        + line(request(3, "tools/call", {"name": "t", "arguments": {"a": 1}}))
        + line({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 3}})
    )
    trailing = json.dumps(request(4, "tools/list")).encode()  # no newline yet

    def kinds(events):
        return [type(e).__name__ for e in events]

    whole = McpServerConnection().feed(data + trailing)
    one = McpServerConnection()
    bytewise = [
        ev for i in range(len(data + trailing)) for ev in one.feed((data + trailing)[i : i + 1])
    ]
    assert kinds(whole) == kinds(bytewise) == ["Reply", "ListTools", "CallTool", "Cancelled"]
    assert one.feed(b"\n") == [ListTools(id=4)]


def test_error_code_follows_the_last_error_written():
    conn = McpServerConnection(era="modern")
    assert conn.error_code is None
    conn.error(1, mcp.INVALID_PARAMS, "no")
    assert conn.error_code == mcp.INVALID_PARAMS
    assert msgspec.json.decode(conn.error(None, mcp.PARSE_ERROR, "x"))["id"] is None
