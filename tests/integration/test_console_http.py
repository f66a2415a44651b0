"""The console's static files on the gateway port, over plain HTTP (no browser): ETags and 304,
security headers, HEAD, the size budget, the loopback Host check, ``host.console: false``, and
the token as a WebSocket subprotocol (answered with ``toolhost.v1``, never echoed)."""

from __future__ import annotations

import pytest
import trio
from trio_websocket import HandshakeError, open_websocket_url

from supervisor.server.console import assets
from tests.conftest import echo, running_host, write_registry
from tests.kernel import served


async def http(port: int, method: str, path: str, **headers: str) -> tuple[int, dict, bytes]:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    lines = [f"{method} {path} HTTP/1.1", f"Host: {headers.pop('Host', f'127.0.0.1:{port}')}"]
    lines += [f"{k.replace('_', '-')}: {v}" for k, v in headers.items()]
    async with stream:
        await stream.send_all(("\r\n".join(lines) + "\r\n\r\n").encode())
        data = b""
        with trio.fail_after(10):
            while chunk := await stream.receive_some(65536):
                data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    status_line, *rest = head.decode("latin-1").split("\r\n")
    fields = {k.lower(): v.strip() for k, _, v in (h.partition(":") for h in rest)}
    return int(status_line.split()[1]), fields, body


def test_the_console_is_small():
    total = sum(len(a.body) for path, a in assets().items() if path != "/index.html")
    assert total < 150 * 1024, total


async def test_pages_etags_and_headers(app):
    async with running_host(app, {"echo": echo(["echo.say"])}) as host, served(host, app) as srv:
        port = srv.ws_port
        status, fields, body = await http(port, "GET", "/")
        assert status == 200 and body.startswith(b"<!doctype html>")
        assert fields["content-type"].startswith("text/html")
        assert "connect-src 'self'" in fields["content-security-policy"]
        assert "default-src 'none'" in fields["content-security-policy"]
        assert fields["x-frame-options"] == "DENY" and fields["referrer-policy"] == "no-referrer"
        etag = fields["etag"]
        assert etag.startswith('"') and int(fields["content-length"]) == len(body)

        status, fields, body = await http(port, "GET", "/", If_None_Match=etag)
        assert status == 304 and body == b"" and fields["etag"] == etag
        status, _, body = await http(port, "GET", "/", If_None_Match='"other"')
        assert status == 200 and body

        for path in ("/console.js", "/console.css"):
            status, fields, body = await http(port, "GET", path)
            assert status == 200 and body == assets()[path].body
        status, fields, body = await http(port, "HEAD", "/console.js")
        assert status == 200 and body == b"" and int(fields["content-length"]) > 1000

        # A DNS-rebinding page reaches a loopback gateway under a foreign name: refused.
        status, _, _ = await http(port, "GET", "/", Host=f"evil.example:{port}")
        assert status == 403
        # Health probes are unchanged, and nothing state-changing answers a GET.
        status, _, body = await http(port, "GET", "/healthz")
        assert status == 200 and b'"status"' in body
        status, _, _ = await http(port, "GET", "/sidecar.restart")
        assert status != 200

        # The browser's way in: the token as a subprotocol; the answer never echoes it.
        async with open_websocket_url(
            f"ws://127.0.0.1:{port}/ws",
            subprotocols=["toolhost.v1", "toolhost.bearer." + srv.token],
            extra_headers=[(b"Origin", f"http://127.0.0.1:{port}".encode())],
        ) as ws:
            assert ws.subprotocol == "toolhost.v1"
            await ws.send_message('{"id": 1, "method": "system.health", "params": {}}')
            assert '"status"' in await ws.get_message()
        for protocols in (["toolhost.v1", "toolhost.bearer.wrong"], ["toolhost.v1"]):
            with pytest.raises(HandshakeError) as refused:
                async with open_websocket_url(f"ws://127.0.0.1:{port}/ws", subprotocols=protocols):
                    pass
            assert getattr(refused.value, "status_code", None) == 401


async def test_console_off(app):
    async with (
        running_host(app, {"echo": echo(["echo.say"])}, host={"console": False}) as host,
        served(host, app) as srv,
    ):
        status, _, body = await http(srv.ws_port, "GET", "/")
        assert status == 404 and b"console is off" in body
        # Turned on again by a registry reload, without a restart.
        write_registry(app, {"echo": echo(["echo.say"])}, host={"console": True})
        await host.reload()
        status, _, _ = await http(srv.ws_port, "GET", "/")
        assert status == 200


async def test_console_key_is_validated(app):
    async with running_host(app, {"echo": echo(["echo.say"])}, host={"console": "yes"}) as host:
        assert any("host.console" in e for e in host.registry.errors), host.registry.errors
        assert host.registry.host.console is True  # the defaults were used
