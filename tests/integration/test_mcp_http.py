"""Remote MCP servers hosted over Streamable HTTP (protocol ``mcp-http``), against a real server
written with the official ``mcp`` SDK and run as a subprocess: tools listed and called, headers
from config, progress, a deadline and a cancel, the server killed (tools unavailable) and started
again on the same port (tools back), a closed port, a bad URL, and a hostile server whose answer
is nested too deep to parse (that call fails, nothing else)."""

from __future__ import annotations

import http.server
import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import msgspec
import trio

from supervisor.calls.call import InvokeRequest
from tests.conftest import (
    FIXTURES,
    echo,
    effective,
    free_port,
    raw,
    running_host,
    wait_available,
    wait_for,
)

SERVER = FIXTURES.parent / "mcp" / "server.py"


class Server:
    """The SDK fixture server on ``127.0.0.1:port`` (stderr kept in a file)."""

    def __init__(self, port: int, log: Path, *extra: str) -> None:
        self.port = port
        self.log = log
        self.extra = extra
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with open(self.log, "ab") as err:
            self.proc = subprocess.Popen(
                [sys.executable, str(SERVER), "--http", str(self.port), *self.extra],
                stdout=subprocess.DEVNULL,
                stderr=err,
            )

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def stderr(self) -> str:
        return self.log.read_text(errors="replace")

    async def listening(self, timeout: float = 20) -> None:
        """Until the port accepts connections (the server is a separate process: poll)."""
        with trio.fail_after(timeout):
            while True:
                assert self.proc is not None and self.proc.poll() is None, self.stderr()
                try:
                    stream = await trio.open_tcp_stream("127.0.0.1", self.port)
                except OSError:
                    await trio.sleep(0.05)
                    continue
                await stream.aclose()
                return

    async def says(self, text: str, timeout: float = 15) -> None:
        with trio.fail_after(timeout):
            while text not in self.stderr():
                await trio.sleep(0.02)


@contextmanager
def http_server(tmp_path: Path, *extra: str, port: int | None = None) -> Iterator[Server]:
    server = Server(port or free_port(), tmp_path / "server.log", *extra)
    server.start()
    try:
        yield server
    finally:
        server.kill()


def entry(port: int, **extra: object) -> dict[str, object]:
    e: dict[str, object] = {
        "protocol": "mcp-http",
        "url": f"http://127.0.0.1:{port}/mcp",
        "restart": {"backoffMs": 20, "maxBackoffMs": 300},
        "probe": {"startTimeoutMs": 20_000, "intervalMs": 300, "failureThreshold": 1},
    }
    e.update(extra)
    return e


def decode(env):
    return msgspec.json.decode(env.data)


async def whoami(host) -> int:
    env = await host.invoker.invoke(InvokeRequest("whoami", raw({})))
    assert env.status == "success", env
    pid: int = decode(env)["pid"]
    return pid


async def test_tools_listed_called_with_headers_and_progress(app, tmp_path):
    with http_server(tmp_path) as server:
        await server.listening()
        config = {"headers": {"Authorization": "Bearer s3cret", "X-Tenant": "blue"}}
        async with running_host(app, {"remote": entry(server.port, config=config)}) as host:
            await wait_available(host, "whoami", "slow", "header", "explode")
            d = host.catalog.get("slow")
            assert d.sidecar == "remote" and d.protocol == "mcp-http"
            assert d.description.startswith("Sleep for")
            assert d.stability.runtime == "ready" and d.stability.probe == "healthy"
            assert await whoami(host) == server.proc.pid
            worker = host.pools["remote"].workers[0]
            # server/discover answered: the stateless era, no session, routing headers instead
            assert worker.conn.era == "modern" and worker.session is None
            env = await host.invoker.invoke(InvokeRequest("header", raw({"name": "mcp-method"})))
            assert env.status == "success" and env.content == "tools/call"
            env = await host.invoker.invoke(InvokeRequest("header", raw({"name": "authorization"})))
            assert env.status == "success" and env.content == "Bearer s3cret"
            env = await host.invoker.invoke(InvokeRequest("header", raw({"name": "x-tenant"})))
            assert env.content == "blue"
            env = await host.invoker.invoke(
                InvokeRequest("header", raw({"name": "mcp-protocol-version"}))
            )
            assert env.content == worker.conn.protocol_version
            seen = []
            env = await host.invoker.invoke(
                InvokeRequest("slow", raw({"seconds": 0.15, "steps": 3})),
                on_progress=lambda data: seen.append(msgspec.json.decode(data)),
            )
            assert env.status == "success" and msgspec.json.decode(env.content) == {"slept": 0.15}
            assert seen == [
                {"progress": i, "total": 3, "message": f"step {i} of 3"} for i in (1, 2, 3)
            ]
            env = await host.invoker.invoke(
                InvokeRequest("explode", raw({"message": "the flux capacitor"}))
            )
            assert env.status == "failed" and "the flux capacitor" in env.content
            # Calls run at once, each on its own stream.
            async with trio.open_nursery() as n:
                for _ in range(4):
                    n.start_soon(host.invoker.invoke, InvokeRequest("slow", raw({"seconds": 0.3})))
            assert host.pools["remote"].statistics().restarts == 0


async def test_json_answers(app, tmp_path):
    with http_server(tmp_path, "--json") as server:
        await server.listening()
        async with running_host(app, {"remote": entry(server.port)}) as host:
            await wait_available(host, "whoami")
            assert await whoami(host) == server.proc.pid
            env = await host.invoker.invoke(InvokeRequest("slow", raw({"seconds": 0.01})))
            assert env.status == "success" and msgspec.json.decode(env.content) == {"slept": 0.01}


async def test_deadline_and_cancel_send_notifications_cancelled(app, tmp_path):
    with http_server(tmp_path) as server:
        await server.listening()
        async with running_host(app, {"remote": entry(server.port)}) as host:
            await wait_available(host, "slow", "whoami")
            env = await host.invoker.invoke(
                InvokeRequest("slow", raw({"seconds": 30, "steps": 30}), timeout_ms=1500)
            )
            assert env.status == "failed" and env.error.code == "timeout"
            await server.says("slow(30.0) was cancelled")
            started = trio.Event()
            out = {}

            async def call() -> None:
                out["env"] = await host.invoker.invoke(
                    InvokeRequest("slow", raw({"seconds": 31, "steps": 31}), key="c1"),
                    on_progress=lambda _: started.set(),
                )

            async with trio.open_nursery() as n:
                n.start_soon(call)
                with trio.fail_after(15):
                    await started.wait()
                assert host.invoker.cancel("c1")
            assert out["env"].status == "failed" and out["env"].error.code == "cancelled"
            await server.says("slow(31.0) was cancelled")
            pool = host.pools["remote"]
            assert pool.workers[0].inflight == 0
            assert await whoami(host) == server.proc.pid
            assert pool.statistics().restarts == 0  # the session was kept


async def test_server_gone_then_back_on_the_same_port(app, tmp_path):
    port = free_port()
    with http_server(tmp_path, port=port) as server:
        await server.listening()
        async with running_host(app, {"remote": entry(port)}) as host:
            await wait_available(host, "whoami")
            first = await whoami(host)
            server.kill()
            await wait_for(host, lambda: effective(host, "whoami") != "available", 20)
            d = host.catalog.get("whoami")
            assert not d.visible
            env = await host.invoker.invoke(InvokeRequest("whoami", raw({}), timeout_ms=2000))
            assert env.status != "success"
            server.start()
            await wait_available(host, "whoami", timeout=30)
            second = await whoami(host)
            assert second == server.proc.pid and second != first
            assert host.pools["remote"].statistics().restarts >= 1


async def test_closed_port_is_unavailable_with_the_reason(app):
    port = free_port()  # nothing listens there
    async with running_host(app, {"remote": entry(port, tools=["whoami"])}) as host:

        def stability() -> str:
            return msgspec.json.encode(host.catalog.get("whoami").stability).decode()

        await wait_for(host, lambda: "cannot connect" in stability())
        d = host.catalog.get("whoami")
        assert d.stability.effective != "available" and not d.visible
        assert f"http://127.0.0.1:{port}/mcp" in stability() and "refused" in stability().lower()


async def test_bad_url_is_manifest_invalid_with_the_json_path(app):
    sidecars = {
        "ftp": {"protocol": "mcp-http", "url": "ftp://example.org/mcp", "tools": ["a"]},
        "nourl": {"protocol": "mcp-http", "tools": ["b"]},
        "both": {"protocol": "mcp-http", "url": "http://x/mcp", "command": "x", "tools": ["c"]},
    }
    async with running_host(app, sidecars) as host:
        messages = {}
        for tool in ("a", "b", "c"):
            d = host.catalog.get(tool)
            assert d.stability.manifest == "invalid"
            messages[tool] = " ".join(r.message for r in d.stability.reasons)
        assert "sidecars.ftp.url" in messages["a"] and "http or https" in messages["a"]
        assert "sidecars.nourl.url" in messages["b"] and "required" in messages["b"]
        assert "sidecars.both.command" in messages["c"]


async def test_headers_from_the_vault(app, tmp_path):
    from supervisor.host.vault import Vault, vault_path

    with http_server(tmp_path) as server:
        await server.listening()
        e = entry(
            server.port,
            tools=["header"],
            config={"headers": {"Authorization": "Bearer ${vault:MCP_TOKEN}"}},
            vault=[{"key": "MCP_TOKEN"}],
        )
        async with running_host(app, {"remote": e}) as host:

            def stability() -> str:
                return msgspec.json.encode(host.catalog.get("header").stability).decode()

            # No value yet: the worker cannot start, and says which key to set (never a value).
            await wait_for(host, lambda: "is not set" in stability())
            assert "toolhost vault set MCP_TOKEN" in stability()
            assert effective(host, "header") != "available"
            Vault(vault_path(str(app))).set("MCP_TOKEN", "v4ult-s3cret")
            await wait_available(host, "header", timeout=30)
            env = await host.invoker.invoke(InvokeRequest("header", raw({"name": "authorization"})))
            assert env.status == "success" and env.content == "Bearer v4ult-s3cret"


DEEP = b"[" * 200_000 + b"]" * 200_000


class _Hostile(http.server.BaseHTTPRequestHandler):
    """A remote MCP server that plays by the rules until a tool is called, then answers with
    JSON nested 200,000 deep (past any parser's recursion limit)."""

    def log_message(self, *args: object) -> None:  # quiet
        pass

    def do_POST(self) -> None:
        msg = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        method, rid = msg.get("method"), msg.get("id")
        if rid is None:  # a notification
            self.send_response(202)
            self.end_headers()
            return
        if method == "initialize":
            result = {
                "protocolVersion": msg["params"]["protocolVersion"],
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "hostile", "version": "1"},
            }
            body = json.dumps({"jsonrpc": "2.0", "id": rid, "result": result}).encode()
        elif method == "tools/list":
            tools = [{"name": "deep", "inputSchema": {"type": "object"}}]
            body = json.dumps({"jsonrpc": "2.0", "id": rid, "result": {"tools": tools}}).encode()
        elif method == "tools/call":
            body = b'{"jsonrpc": "2.0", "id": %s, "result": ' % json.dumps(rid).encode()
            body += DEEP + b"}"
        else:
            body = json.dumps({"jsonrpc": "2.0", "id": rid, "result": {}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_DELETE(self) -> None:
        self.send_response(200)
        self.end_headers()

    def do_GET(self) -> None:
        self.send_response(405)
        self.end_headers()


async def test_an_answer_nested_too_deep_fails_that_call_only(app, tmp_path):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hostile)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        port = server.server_address[1]
        async with running_host(app, {"remote": entry(port), "echo": echo(["echo.say"])}) as host:
            await wait_available(host, "deep", "echo.say")
            env = await host.invoker.invoke(InvokeRequest("deep", raw({})))
            assert env.status == "failed"
            assert env.error.code == "protocol-error", env.error
            assert "not a JSON-RPC message in an HTTP answer" in env.error.message
            # The host and its other sidecars carry on.
            said = await host.invoker.invoke(InvokeRequest("echo.say", raw({"text": "still here"})))
            assert said.status == "success"
            await wait_available(host, "deep")
    finally:
        server.shutdown()
        server.server_close()
