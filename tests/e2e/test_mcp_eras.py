"""``toolhost mcp`` in both eras of MCP, driven by the official SDK client: ``mode="auto"`` (it
sends ``server/discover`` and gets the stateless 2026-07-28 revision), a pinned stateless
revision (no probe at all) and ``mode="legacy"`` (the ``initialize`` handshake), over stdio and
Streamable HTTP. The same scenario runs in each: list, call, progress, a cancel that really
stops the call, and a tool that appears later announced as the era says (``subscriptions/listen``
or ``notifications/tools/list_changed``). Over HTTP the stateless era keeps nothing between
requests, so two ``toolhost mcp --http`` in front of one host answer one client's requests in
turn."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from mcp.client.subscriptions import SubscriptionLost, ToolsListChanged

from tests.conftest import echo, script, write_registry
from tests.e2e.conftest import serve, stop
from tests.e2e.mcp_client import (
    Watcher,
    http_client_in,
    start_http,
    stdio_client_in,
    text_of,
)

pytestmark = pytest.mark.slow

MODERN = "2026-07-28"


def _registry(root: Path) -> None:
    write_registry(
        root,
        {
            # One worker, one call at a time: a call after a cancelled one runs at once only if
            # the cancel really reached the sidecar.
            "echo": echo(env={"ECHO_CONCURRENCY": "1"}, pool={"min": 1, "max": 1}),
            "flaky": script(
                "flaky",
                ["flaky.work"],
                restart={"backoffMs": 10, "maxBackoffMs": 100, "intensity": 1},
            ),
        },
    )


async def _names(client: Any) -> set[str]:
    return {t.name for t in (await client.list_tools()).tools}


async def _until_listed(client: Any, name: str) -> None:
    with anyio.fail_after(40):
        while name not in await _names(client):
            await anyio.sleep(0.1)


async def _scenario(client: Any, root: Path, watcher: Watcher, era: str) -> None:
    assert client.protocol_version == (MODERN if era == "modern" else "2025-11-25")
    await _until_listed(client, "echo.say")
    names = await _names(client)
    assert {"echo.say", "echo.sleep"} <= names and "flaky.work" not in names

    result = await client.call_tool("echo.say", {"text": "hello"})
    assert result.is_error is False
    assert text_of(result) == "hello"
    assert result.structured_content["text"] == "hello"

    seen: list[float] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append(progress)

    slept = await client.call_tool(
        "echo.sleep", {"seconds": 0.2, "steps": 3}, progress_callback=on_progress
    )
    assert slept.is_error is False
    assert seen == [1.0, 2.0, 3.0]

    # A cancel (stdio: notifications/cancelled; stateless HTTP: the request's connection closed)
    # stops the call in the host: the single slot is free again at once.
    with anyio.move_on_after(0.5):
        await client.call_tool("echo.sleep", {"seconds": 20, "steps": 200})
    started = time.monotonic()
    again = await client.call_tool("echo.say", {"text": "after cancel"})
    assert text_of(again) == "after cancel"
    assert time.monotonic() - started < 5

    # A tool that comes later is announced in the client's era.
    if era == "modern":
        async with client.listen(tools_list_changed=True) as sub:
            assert sub.honored.tools_list_changed is True
            (root / "fixed").write_text("")
            with anyio.fail_after(40):
                while "flaky.work" not in await _names(client):
                    event = await sub.__anext__()
                    assert event == ToolsListChanged()
    else:
        (root / "fixed").write_text("")
        with anyio.fail_after(40):
            while "flaky.work" not in await _names(client):
                seen_changes = watcher.list_changed
                await watcher.beyond(seen_changes)
        assert watcher.list_changed >= 1
    work = await client.call_tool("flaky.work", {})
    assert work.is_error is False


@pytest.mark.parametrize(("mode", "era"), [("auto", "modern"), ("legacy", "handshake")])
def test_stdio_in_both_eras(app, mode, era):
    _registry(app)

    async def main() -> None:
        watcher = Watcher()
        async with stdio_client_in(app, "--embedded", mode=mode, watcher=watcher) as client:
            assert client.server_info is not None and client.server_info.name == "toolhost"
            assert client.server_capabilities.tools is not None
            assert client.server_capabilities.tools.list_changed is True
            await _scenario(client, app, watcher, era)

    anyio.run(main)


def test_stdio_pinned_to_the_stateless_revision_without_a_probe(app):
    """A client that knows the revision sends no ``server/discover``: its first request, with
    the envelope, picks the era."""
    write_registry(app, {"echo": echo(tools=["echo.say"])})

    async def main() -> None:
        async with stdio_client_in(app, "--embedded", mode=MODERN) as client:
            await _until_listed(client, "echo.say")
            result = await client.call_tool("echo.say", {"text": "pinned"})
            assert text_of(result) == "pinned"

    anyio.run(main)


@pytest.mark.parametrize(("mode", "era"), [("auto", "modern"), ("legacy", "handshake")])
def test_http_in_both_eras(app, mode, era):
    _registry(app)
    proc, url = start_http(app, "--embedded")
    try:
        token = (app / ".toolhost" / "mcp.token").read_text().strip()

        async def main() -> None:
            watcher = Watcher()
            async with http_client_in(url, token, mode=mode, watcher=watcher) as client:
                await _scenario(client, app, watcher, era)

        anyio.run(main)
    finally:
        stop(proc)


def _modern(rid: int, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
    meta = {
        "io.modelcontextprotocol/protocolVersion": MODERN,
        "io.modelcontextprotocol/clientCapabilities": {},
        "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "1"},
    }
    return {
        "jsonrpc": "2.0",
        "id": rid,
        "method": method,
        "params": {**(params or {}), "_meta": meta},
    }


def _headers(token: str, method: str, name: str | None = None) -> dict[str, str]:
    headers = {
        "Authorization": f"Bearer {token}",
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": MODERN,
        "Mcp-Method": method,
    }
    if name is not None:
        headers["Mcp-Name"] = name
    return headers


def test_stateless_http_needs_no_session_so_any_replica_answers(app):
    """Two ``toolhost mcp --http`` in front of one ``toolhost serve``: a client's requests,
    spread over both, are answered as if there were one; the answers name no session; the
    routing headers are checked against the body."""
    write_registry(app, {"echo": echo(tools=["echo.say"])})
    with serve(app):
        first, url_a = start_http(app)
        second, url_b = start_http(app)
        try:
            token = (app / ".toolhost" / "mcp.token").read_text().strip()

            async def main() -> None:
                async with httpx2.AsyncClient(timeout=30) as http:
                    r = await http.post(
                        url_a,
                        json=_modern(1, "server/discover"),
                        headers=_headers(token, "server/discover"),
                    )
                    assert r.status_code == 200
                    assert r.json()["result"]["supportedVersions"] == [MODERN]
                    assert "mcp-session-id" not in r.headers
                    with anyio.fail_after(30):
                        while True:
                            r = await http.post(
                                url_b,
                                json=_modern(2, "tools/list"),
                                headers=_headers(token, "tools/list"),
                            )
                            assert r.status_code == 200, r.text
                            if [t["name"] for t in r.json()["result"]["tools"]] == ["echo.say"]:
                                break
                            await anyio.sleep(0.1)
                    for i, url in enumerate([url_a, url_b, url_a, url_b]):
                        call = _modern(
                            10 + i,
                            "tools/call",
                            {"name": "echo.say", "arguments": {"text": str(i)}},
                        )
                        r = await http.post(
                            url, json=call, headers=_headers(token, "tools/call", "echo.say")
                        )
                        assert r.status_code == 200
                        assert "mcp-session-id" not in r.headers
                        body = r.json()
                        assert body["id"] == 10 + i
                        assert body["result"]["structuredContent"]["text"] == str(i)
                        assert body["result"]["resultType"] == "complete"
                    # The headers must say what the body says.
                    call = _modern(
                        20, "tools/call", {"name": "echo.say", "arguments": {"text": "x"}}
                    )
                    r = await http.post(
                        url_b, json=call, headers=_headers(token, "tools/call", "echo.other")
                    )
                    assert r.status_code == 400
                    assert r.json()["error"]["code"] == -32020
                    # A revision we do not speak in the envelope: -32022 naming ours.
                    wrong = _modern(21, "tools/list")
                    wrong["params"]["_meta"]["io.modelcontextprotocol/protocolVersion"] = (
                        "2030-01-01"
                    )
                    headers = {
                        **_headers(token, "tools/list"),
                        "MCP-Protocol-Version": "2030-01-01",
                    }
                    r = await http.post(url_a, json=wrong, headers=headers)
                    assert r.status_code == 400  # an unknown header revision: refused up front
                    r = await http.post(url_a, json=wrong, headers=_headers(token, "tools/list"))
                    assert r.status_code == 400 and r.json()["error"]["code"] == -32020
                    # initialize sent as a stateless request: told which revision is spoken.
                    init = {
                        "jsonrpc": "2.0",
                        "id": 22,
                        "method": "initialize",
                        "params": {"protocolVersion": "2025-11-25", "capabilities": {}},
                    }
                    r = await http.post(url_a, json=init, headers=_headers(token, "initialize"))
                    assert r.status_code == 400
                    assert r.json()["error"]["data"] == {
                        "supported": [MODERN],
                        "requested": "2025-11-25",
                    }
                    # No GET stream, no session to delete, an unknown method is 404.
                    r = await http.get(url_a, headers=_headers(token, "x"))
                    assert r.status_code == 405
                    r = await http.post(
                        url_b,
                        json=_modern(23, "logging/setLevel"),
                        headers=_headers(token, "logging/setLevel"),
                    )
                    assert r.status_code == 404 and r.json()["error"]["code"] == -32601
                    # A notification is acknowledged and dropped.
                    note = {
                        "jsonrpc": "2.0",
                        "method": "notifications/cancelled",
                        "params": {"requestId": 1},
                    }
                    r = await http.post(
                        url_a, json=note, headers=_headers(token, "notifications/cancelled")
                    )
                    assert r.status_code == 202

            anyio.run(main)
        finally:
            stop(first)
            stop(second)


def test_a_handshake_session_is_not_answered_by_the_stateless_era(app):
    """Today's handshake clients see no change: a session's requests carry no revision header
    the stateless era would take, and a request without a session is still refused."""
    write_registry(app, {"echo": echo(tools=["echo.say"])})
    proc, url = start_http(app, "--embedded")
    try:
        token = (app / ".toolhost" / "mcp.token").read_text().strip()

        async def main() -> None:
            auth = {"Authorization": f"Bearer {token}", "Accept": "application/json"}
            async with httpx2.AsyncClient(timeout=30) as http:
                call = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}
                r = await http.post(url, json=call, headers=auth)
                assert r.status_code == 400
                assert r.json()["error"]["code"] == -32600
                assert "send initialize first" in r.json()["error"]["message"]
                init = {
                    "jsonrpc": "2.0",
                    "id": 1,
                    "method": "initialize",
                    "params": {"protocolVersion": MODERN, "capabilities": {}},
                }
                r = await http.post(url, json=init, headers=auth)
                assert r.json()["result"]["protocolVersion"] == "2025-11-25"
                assert json.loads(r.text)["result"]["capabilities"] == {
                    "tools": {"listChanged": True},
                    "resources": {"subscribe": True, "listChanged": True},
                    "prompts": {"listChanged": True},
                    "completions": {},
                }
                assert r.headers["mcp-session-id"]

        anyio.run(main)
    finally:
        stop(proc)


def test_stateless_http_without_its_host_and_a_listen_stream_that_loses_it(app):
    """``toolhost mcp --http`` before its host: ``server/discover`` is answered (it needs no
    host), a request that does need it is 503. Once the host is up a listen stream opens; when
    the host goes, the stream ends without its closing result, so the client knows to listen
    again."""
    write_registry(app, {"echo": echo(tools=["echo.say"])})
    proc, url = start_http(app)
    try:
        token = (app / ".toolhost" / "mcp.token").read_text().strip()

        async def before() -> None:
            async with httpx2.AsyncClient(timeout=30) as http:
                r = await http.post(
                    url,
                    json=_modern(1, "server/discover"),
                    headers=_headers(token, "server/discover"),
                )
                assert r.status_code == 200
                r = await http.post(
                    url, json=_modern(2, "tools/list"), headers=_headers(token, "tools/list")
                )
                assert r.status_code == 503

        anyio.run(before)
        with serve(app) as host:

            async def listen() -> None:
                async with http_client_in(url, token, mode="auto") as client:
                    await _until_listed(client, "echo.say")
                    async with client.listen(tools_list_changed=True) as sub:
                        stop(host)  # the host goes away under the open stream
                        with anyio.fail_after(30), pytest.raises(SubscriptionLost):
                            async for _ in sub:
                                pass

            anyio.run(listen)
    finally:
        stop(proc)
