"""The host's sans-IO MCP client (``protocols/mcp.py``) in the stateless era against a real server
written with the official SDK (``tests/fixtures/mcp/server.py``), over stdio and Streamable HTTP:
``server/discover`` is answered with a modern result, every enveloped request is accepted (over
HTTP the SDK checks our ``MCP-Protocol-Version``/``Mcp-Method``/``Mcp-Name`` against the body),
``server/discover`` serves as the probe, and ``subscriptions/listen`` brings the server's
``tools/list_changed``. What the worker does with it comes once ``workers/mcp.py`` is hooked up;
this proves the wire side against the reference implementation."""

from __future__ import annotations

import subprocess
import sys

import httpx2
import msgspec
import trio

from supervisor.protocols import mcp as proto
from supervisor.protocols import mcp_http
from tests.conftest import FIXTURES, free_port
from tests.integration.test_mcp_http import http_server

SERVER = FIXTURES.parent / "mcp" / "server.py"


class Stdio:
    """The fixture server over stdio, with a connection fed from its stdout."""

    def __init__(self, proc: trio.Process) -> None:
        self.proc = proc
        self.conn = proto.McpConnection(client_name="toolhost", client_version="9")
        self.events: list[proto.Event] = []

    async def send(self, data: bytes) -> None:
        assert self.proc.stdin is not None
        await self.proc.stdin.send_all(data)

    async def until(self, wanted) -> proto.Event:
        """The first event (pending or read from now) for which ``wanted`` is true."""
        assert self.proc.stdout is not None
        while True:
            for i, ev in enumerate(self.events):
                if wanted(ev):
                    return self.events.pop(i)
            self.events += self.conn.feed(await self.proc.stdout.receive_some(1 << 16))

    async def ask(self, request: tuple[int, bytes]) -> proto.Response:
        rid, line = request
        await self.send(line)
        ev = await self.until(lambda e: isinstance(e, proto.Response) and e.id == rid)
        assert isinstance(ev, proto.Response)
        return ev


async def test_stateless_era_against_the_sdk_over_stdio():
    process = await trio.lowlevel.open_process(
        [sys.executable, str(SERVER)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    try:
        with trio.fail_after(60):
            s = Stdio(process)
            discovered = await s.ask(s.conn.discover())
            assert s.conn.discovered(discovered) is True
            assert s.conn.protocol_version == "2026-07-28"
            assert s.conn.server is not None
            assert s.conn.server.capabilities.tools is not None

            page = await s.ask(s.conn.list_tools())
            tools, _ = proto.tools_page(page)
            assert {"slow", "whoami", "grow"} <= {t.name for t in tools}

            called = await s.ask(s.conn.call_tool("whoami", msgspec.Raw(b"{}")))
            answer = proto.call_answer(called)
            assert answer.ok and msgspec.json.decode(answer.data)["pid"] == process.pid

            probe = await s.ask(s.conn.probe())
            assert probe.error is None

            lid, line = s.conn.listen()
            await s.send(line)
            grown = await s.ask(s.conn.call_tool("grow", msgspec.Raw(b'{"name": "late"}')))
            assert proto.call_answer(grown).ok
            await s.until(lambda e: isinstance(e, proto.ToolsChanged))
            page = await s.ask(s.conn.list_tools())
            assert "late" in {t.name for t in proto.tools_page(page)[0]}
            assert lid in s.conn.pending  # the stream is still open
    finally:
        process.kill()
        await process.wait()


def _post(http: httpx2.Client, url: str, conn: proto.McpConnection, request: tuple[int, bytes]):
    rid, body = request
    headers = dict(conn.http_headers(rid))
    headers.update({"Accept": mcp_http.ACCEPT, "Content-Type": "application/json"})
    r = http.post(url, content=body, headers=headers)
    assert "mcp-session-id" not in r.headers  # the stateless era: no session
    assert r.status_code == 200, r.text
    if r.headers["content-type"].startswith("text/event-stream"):
        lines = b"".join(mcp_http.SseParser(1 << 24).feed(r.content))
    else:
        lines = mcp_http.json_line(r.content)
    [response] = [e for e in conn.feed(lines) if isinstance(e, proto.Response)]
    return response


async def test_stateless_era_against_the_sdk_over_http(tmp_path):
    with http_server(tmp_path, port=free_port()) as server:
        await server.listening()
        url = f"http://127.0.0.1:{server.port}/mcp"

        def talk() -> None:
            conn = proto.McpConnection(client_name="toolhost", client_version="9")
            with httpx2.Client(timeout=30) as http:
                assert conn.discovered(_post(http, url, conn, conn.discover()))
                tools, _ = proto.tools_page(_post(http, url, conn, conn.list_tools()))
                assert "header" in {t.name for t in tools}
                # The SDK checks Mcp-Name against the body; the tool reads the header back.
                call = conn.call_tool("header", msgspec.Raw(b'{"name": "mcp-name"}'))
                answer = proto.call_answer(_post(http, url, conn, call))
                assert answer.ok and answer.content == "header"
                assert _post(http, url, conn, conn.probe()).error is None

        await trio.to_thread.run_sync(talk)
