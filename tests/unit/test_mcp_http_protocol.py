"""The pure parts of the Streamable HTTP client (``protocols/mcp_http.py``) and the registry rules
for ``protocol: "mcp-http"``."""

import json

import pytest

from supervisor.protocols import mcp_http
from supervisor.registry.load import validate_entry


def test_parse_url():
    ep = mcp_http.parse_url("https://mcp.example.org/v1/mcp?tenant=a")
    assert (ep.tls, ep.host, ep.port, ep.target) == (
        True,
        "mcp.example.org",
        443,
        "/v1/mcp?tenant=a",
    )
    assert ep.host_header == "mcp.example.org"
    ep = mcp_http.parse_url("http://127.0.0.1:8123")
    assert (ep.tls, ep.port, ep.target, ep.host_header) == (False, 8123, "/", "127.0.0.1:8123")
    assert mcp_http.parse_url("http://[::1]:9/mcp").host_header == "[::1]:9"


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("ftp://example.org/mcp", "scheme must be http or https (got ftp)"),
        ("example.org/mcp", "scheme must be http or https (got none)"),
        ("http:///mcp", "no host"),
        ("http://user:pw@example.org/mcp", "credentials in config.headers"),
        ("http://example.org:99999/mcp", "not a valid URL"),
        ("http://example.org/mcp#x", "fragment"),
        ("http://example.org/m cp", "whitespace"),
    ],
)
def test_bad_urls(url, says):
    problem = mcp_http.url_problem(url)
    assert problem is not None and says in problem


def test_request_headers_keep_transport_headers_ours():
    ep = mcp_http.parse_url("http://h:1/mcp")
    extra = mcp_http.extra_headers(
        {"headers": {"Authorization": "Bearer t", "Host": "evil", "Mcp-Session-Id": "x", "n": 1}}
    )
    assert extra == [("Authorization", "Bearer t")]
    headers = dict(
        mcp_http.request_headers(ep, session="s1", version="2025-11-25", extra=extra, body=b"{}")
    )
    assert headers["Host"] == "h:1" and headers["Content-Length"] == "2"
    assert headers["Mcp-Session-Id"] == "s1" and headers["MCP-Protocol-Version"] == "2025-11-25"
    assert headers["Accept"] == "application/json, text/event-stream"
    delete = dict(mcp_http.request_headers(ep, session="s1", version=None, extra=[], body=None))
    assert "Content-Type" not in delete and "MCP-Protocol-Version" not in delete


def test_sse_parser_splits_events_across_chunks():
    p = mcp_http.SseParser(1024)
    stream = (
        b': keep-alive\r\n\r\nevent: message\r\nid: 1\r\ndata: {"a":\r\n'
        b'data: 1}\r\n\r\nevent: other\ndata: {"skip":1}\n\ndata: {"b":2}\n\n'
    )
    out = []
    for i in range(len(stream)):
        out += p.feed(stream[i : i + 1])
    assert [json.loads(line) for line in out] == [{"a": 1}, {"b": 2}]
    assert all(line.endswith(b"\n") and line.count(b"\n") == 1 for line in out)


def test_sse_parser_bounds_an_event():
    p = mcp_http.SseParser(16)
    with pytest.raises(ValueError, match="longer than 16"):
        p.feed(b"data: " + b"x" * 10 + b"\ndata: " + b"y" * 10 + b"\n")


def test_json_line():
    assert mcp_http.json_line(b'{\n  "a": "x"\r\n}') == b'{   "a": "x"  }\n'


def test_registry_rules_for_mcp_http():
    ok = {"protocol": "mcp-http", "url": "https://example.org/mcp"}
    assert validate_entry("r", ok) == []
    assert validate_entry("r", {**ok, "url": "file:///x"}) == [
        "sidecars.r.url: 'file:///x': the scheme must be http or https (got file)"
    ]
    assert validate_entry("r", {"protocol": "mcp-http"}) == [
        'sidecars.r.url: required for protocol "mcp-http"'
    ]
    assert validate_entry("r", {**ok, "command": "node"}) == [
        'sidecars.r.command: protocol "mcp-http" connects to a url; it runs no command'
    ]
    assert validate_entry("r", {**ok, "config": {"headers": {"A": 1}}}) == [
        "sidecars.r.config.headers.A: expected a string"
    ]
    assert validate_entry("r", {**ok, "config": {"headers": ["A"]}}) == [
        "sidecars.r.config.headers: expected an object of strings"
    ]
    assert validate_entry("r", {"command": "x", "url": "http://h/mcp"}) == [
        'sidecars.r.url: only for protocol "mcp-http"'
    ]
    assert validate_entry("r", {"args": []}) == ["sidecars.r.command: required field missing"]


def test_vault_references_in_headers():
    config = {"headers": {"Authorization": "Bearer ${vault:TOK}", "X": "plain"}, "other": 1}
    assert mcp_http.header_problems(config, {"TOK"}) == []
    assert mcp_http.header_problems(config, set()) == [
        ("Authorization", "vault key 'TOK' is not declared in the entry's vault")
    ]
    assert mcp_http.header_problems({"headers": {"A": "x\r\nB: y"}}, set()) == [
        ("A", "a header value cannot hold a line break or NUL")
    ]
    resolved, problem = mcp_http.resolve_headers(config, {"TOK": "s3"}.get)
    assert problem is None
    assert resolved == {"headers": {"Authorization": "Bearer s3", "X": "plain"}, "other": 1}
    resolved, problem = mcp_http.resolve_headers(config, {}.get)
    assert problem == (
        "config.headers.Authorization: vault key 'TOK' is not set (`toolhost vault set TOK`)"
    )
    assert "headers" not in resolved
    _, problem = mcp_http.resolve_headers(config, {"TOK": "a\nb"}.get)
    assert problem is not None and "line break" in problem and "a\nb" not in problem

    def broken(key):
        raise ValueError("refusing to read the vault: mode 0644")

    _, problem = mcp_http.resolve_headers(config, broken)
    assert problem is not None and "mode 0644" in problem


def test_registry_checks_vault_keys_of_headers():
    entry = {
        "protocol": "mcp-http",
        "url": "https://example.org/mcp",
        "config": {"headers": {"Authorization": "Bearer ${vault:TOK}"}},
    }
    assert validate_entry("r", entry) == [
        "sidecars.r.config.headers.Authorization: vault key 'TOK' is not declared in the "
        "entry's vault"
    ]
    assert validate_entry("r", {**entry, "vault": [{"key": "TOK"}]}) == []
