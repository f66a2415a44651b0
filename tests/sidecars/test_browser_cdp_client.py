"""The browser sidecar's pieces that need no browser: the URL policy, the DevTools HTTP GET
(against loopback servers answering as Chromium does: keep-alive with Content-Length, chunked,
errors) and the CDP connection's error paths (error answers, deadlines, a peer that goes away)
against a loopback WebSocket peer."""

from __future__ import annotations

import math

import msgspec
import pytest
import trio
import trio.testing
from trio_websocket import serve_websocket

from sidecars.browser_cdp.browser import check_url, png_size
from sidecars.browser_cdp.cdp import (
    BrowserGone,
    CDPError,
    CDPTimeout,
    Connection,
    EndpointDown,
    browser_socket_url,
    http_get_json,
    is_gone_session,
)
from sidecars.sdk import ToolError


def test_url_policy(tmp_path):
    root = tmp_path / "project"
    root.mkdir()
    (root / "page.html").write_text("x")
    for ok in [
        "http://a.example/x",
        "https://a.example",
        "about:blank",
        (root / "page.html").as_uri(),
    ]:
        assert check_url(ok, str(root)) == ok
    for bad, reason in [
        ("javascript:alert(1)", "scheme-refused"),
        ("data:text/html,x", "scheme-refused"),
        ("chrome://settings", "scheme-refused"),
        ("ftp://a.example/f", "scheme-refused"),
        ("a.example/path", "scheme-refused"),
        ("http:///nohost", "no-host"),
        ("file:///etc/passwd", "file-outside-project"),
        (f"file://{root}/../x.html", "file-outside-project"),
        (f"file://elsewhere{root}/page.html", "file-outside-project"),
    ]:
        with pytest.raises(ToolError) as info:
            check_url(bad, str(root))
        assert info.value.code == "invalid-input"
        assert info.value.details["reason"] == reason, bad


def test_png_size_and_socket_url():
    header = b"\x89PNG\r\n\x1a\n" + b"\x00\x00\x00\rIHDR" + (640).to_bytes(4, "big")
    assert png_size(header + (480).to_bytes(4, "big") + b"rest") == (640, 480)
    with pytest.raises(ToolError):
        png_size(b"GIF89a" + b"\x00" * 30)
    version = {"webSocketDebuggerUrl": "ws://127.0.0.1:9222/devtools/browser/abc"}
    assert (
        browser_socket_url("http://localhost:9333", version)
        == "ws://localhost:9333/devtools/browser/abc"
    )
    with pytest.raises(EndpointDown):
        browser_socket_url("http://x:1", {"Browser": "no url"})


async def http_peer(nursery, answer: bytes) -> int:
    """A loopback TCP server that answers every request with ``answer`` and keeps the socket."""

    async def handle(stream):
        await stream.receive_some(65536)
        await stream.send_all(answer)
        await trio.sleep_forever()  # like Chromium: the connection stays open

    listeners = await nursery.start(trio.serve_tcp, handle, 0)
    return listeners[0].socket.getsockname()[1]


async def test_http_get_reads_to_content_length_chunked_and_errors():
    body = b'{"webSocketDebuggerUrl": "ws://127.0.0.1:1/devtools/browser/x"}'
    async with trio.open_nursery() as nursery:
        port = await http_peer(
            nursery,
            b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body,
        )
        got = await http_get_json(f"http://127.0.0.1:{port}", "/json/version", within=5)
        assert got["webSocketDebuggerUrl"].endswith("/x")

        chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        chunked += b"5\r\n[1,2]\r\n0\r\n\r\n"
        port = await http_peer(nursery, chunked)
        with pytest.raises(EndpointDown, match="no answer within"):
            # No Content-Length and the peer never closes: the deadline ends the wait.
            await http_get_json(f"http://127.0.0.1:{port}", "/json/version", within=0.3)

        port = await http_peer(nursery, b"HTTP/1.1 500 Boom\r\nContent-Length: 0\r\n\r\n")
        with pytest.raises(EndpointDown, match="500"):
            await http_get_json(f"http://127.0.0.1:{port}", "/json/version", within=5)
        nursery.cancel_scope.cancel()

    with pytest.raises(EndpointDown):
        await http_get_json("http://127.0.0.1:9", "/json/version", within=5)
    with pytest.raises(EndpointDown, match="not an http"):
        await http_get_json("ws://127.0.0.1:9", "/json/version", within=5)


async def test_http_get_chunked_body_closed_by_peer():
    async def handle(stream):
        await stream.receive_some(65536)
        await stream.send_all(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n[1,2]\r\n0\r\n\r\n"
        )
        await stream.aclose()

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(trio.serve_tcp, handle, 0)
        port = listeners[0].socket.getsockname()[1]
        assert await http_get_json(f"http://127.0.0.1:{port}", "/", within=5) == [1, 2]
        nursery.cancel_scope.cancel()


async def cdp_peer(nursery, behaviour):
    """A loopback WebSocket peer: ``behaviour(request) -> answer | None | "close"``."""

    async def handler(request):
        ws = await request.accept()
        while True:
            msg = msgspec.json.decode(await ws.get_message())
            answer = behaviour(msg)
            if answer == "close":
                await ws.aclose()
                return
            for one in answer if isinstance(answer, list) else [answer] if answer else []:
                await ws.send_message(msgspec.json.encode(one).decode())

    server = await nursery.start(serve_websocket, handler, "127.0.0.1", 0, None)
    return f"ws://127.0.0.1:{server.port}/devtools/browser/x"


async def test_connection_results_errors_deadlines_and_a_peer_that_leaves():
    def behaviour(msg):
        method = msg["method"]
        if method == "Ok.echo":
            return {
                "id": msg["id"],
                "result": {"params": msg["params"], "sid": msg.get("sessionId")},
            }
        if method == "Bad.request":
            return {"id": msg["id"], "error": {"code": -32000, "message": "No target"}}
        if method == "Never.answer":
            return None
        if method == "Close.tab":  # the tab of session S9 goes away; Chromium drops its requests
            event = {"method": "Target.detachedFromTarget", "params": {"sessionId": "S9"}}
            return [event, {"id": msg["id"], "result": {}}]
        return "close"

    async with trio.open_nursery() as nursery:
        url = await cdp_peer(nursery, behaviour)
        conn = await Connection.open(nursery, url, within=5)
        got = await conn.send("Ok.echo", {"a": 1}, session="S1")
        assert got == {"params": {"a": 1}, "sid": "S1"}
        with pytest.raises(CDPError) as info:
            await conn.send("Bad.request")
        assert info.value.code == -32000 and info.value.method == "Bad.request"
        with pytest.raises(CDPTimeout):
            await conn.send("Never.answer", deadline=trio.current_time() + 0.2)
        assert conn.alive

        # A tab closed under a waiting request (and an event wait) fails them at once.
        async def on_closed_tab(out):
            with pytest.raises(CDPError) as info:
                await conn.send("Never.answer", session="S9")
            out.append(is_gone_session(info.value))

        seen: list[bool] = []
        with conn.subscribe("S9", "Page.loadEventFired") as events:
            async with trio.open_nursery() as inner:
                inner.start_soon(on_closed_tab, seen)
                await trio.testing.wait_all_tasks_blocked()
                with trio.fail_after(5):
                    await conn.send("Close.tab")
            assert seen == [True] and "S9" in conn.detached
            with trio.fail_after(5):
                assert [e async for e in events] == []

        # A request waiting when the peer closes fails at once, and so does an event wait.
        async def waiting(out):
            with pytest.raises(BrowserGone):
                await conn.send("Never.answer", deadline=math.inf)
            out.append("gone")

        out: list[str] = []
        with conn.subscribe("S1", "Page.loadEventFired") as events:
            async with trio.open_nursery() as inner:
                inner.start_soon(waiting, out)
                await trio.testing.wait_all_tasks_blocked()
                with trio.fail_after(5):
                    with pytest.raises(BrowserGone):
                        await conn.send("Go.away")
            assert out == ["gone"]
            with trio.fail_after(5):
                assert [e async for e in events] == []
        assert not conn.alive
        with pytest.raises(BrowserGone):
            await conn.send("Ok.echo")
        nursery.cancel_scope.cancel()


async def test_connection_open_fails_cleanly():
    async with trio.open_nursery() as nursery:
        with pytest.raises(BrowserGone):
            await Connection.open(nursery, "ws://127.0.0.1:9/devtools/browser/x", within=2)
