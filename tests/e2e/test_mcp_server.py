"""``toolhost mcp`` driven by the official MCP SDK client, over stdio and Streamable HTTP.

The host is a real ``toolhost serve`` (or ``--embedded``); the sidecars are the echo and flaky
test sidecars; every call goes through the kernel protocol (visibility, approval, deadlines).
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import anyio
import httpx2
import pytest

from tests.conftest import echo, script, write_registry
from tests.e2e.conftest import TOOLHOST, serve
from tests.e2e.mcp_client import Watcher, http_session, start_http, stdio_session, text_of

pytestmark = pytest.mark.slow


ECHO_MANIFEST = """
[[tool]]
name = "echo.say"
description = "Echo the text back."
readOnly = true
permission = "read"
inputSchema = { type = "object", required = ["text"], properties = { text = { type = "string" } } }
outputSchema = { type = "object", properties = { text = { type = "string" } } }
"""


def _registry(root: Path) -> None:
    (root / "manifests").mkdir(exist_ok=True)
    (root / "manifests" / "echo.toml").write_text(ECHO_MANIFEST)
    write_registry(
        root,
        {
            # One worker, one call at a time: a call after a cancelled one only runs at once if
            # the cancel really reached the sidecar.
            "echo": echo(
                sandbox={"echo.env": "approval-required"},
                env={"ECHO_CONCURRENCY": "1"},
                pool={"min": 1, "max": 1},
            ),
            "flaky": script(
                "flaky",
                ["flaky.work"],
                restart={"backoffMs": 10, "maxBackoffMs": 100, "intensity": 1},
            ),
        },
    )


def _tool_names(listing) -> set[str]:
    return {t.name for t in listing.tools}


async def _wait_listed(session, name: str, present: bool, watcher: Watcher) -> None:
    """Wait (on list_changed notifications) until ``name`` is (or is not) listed."""
    with anyio.fail_after(40):
        while True:
            seen = watcher.list_changed
            if (name in _tool_names(await session.list_tools())) == present:
                return
            await watcher.beyond(seen)


async def _scenario(session, watcher: Watcher, root: Path) -> None:
    await _wait_listed(session, "echo.say", True, watcher)
    listing = await session.list_tools()
    names = _tool_names(listing)
    assert {"echo.say", "echo.sleep", "echo.crash", "echo.env"} <= names
    # The flaky sidecar cannot start: its tool is unavailable, so it is not listed.
    assert "flaky.work" not in names
    say = next(t for t in listing.tools if t.name == "echo.say")
    assert say.annotations.read_only_hint is True
    assert say.annotations.destructive_hint is False
    assert say.input_schema["properties"]["text"]["type"] == "string"
    assert say.output_schema["properties"]["text"]["type"] == "string"
    sleep = next(t for t in listing.tools if t.name == "echo.sleep")
    assert sleep.annotations.read_only_hint is False
    assert sleep.annotations.destructive_hint is True

    # A call: structured content plus a text block.
    result = await session.call_tool("echo.say", {"text": "hello"})
    assert result.is_error is False
    assert text_of(result) == "hello"
    assert result.structured_content["text"] == "hello"

    # Bad input is the tool's failure with our code, not a protocol error.
    bad = await session.call_tool("echo.say", {"nope": 1})
    assert bad.is_error is True
    assert text_of(bad).startswith("[invalid-input]")

    # approval-required: refused with isError and the code.
    refused = await session.call_tool("echo.env", {})
    assert refused.is_error is True
    assert refused.structured_content["error"]["code"] == "approval-required"

    # Progress: tool.progress events become notifications/progress.
    seen: list[tuple[float, str | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append((progress, message))

    slept = await session.call_tool(
        "echo.sleep", {"seconds": 0.2, "steps": 3}, progress_callback=on_progress
    )
    assert slept.is_error is False
    assert [p for p, _ in seen] == [1.0, 2.0, 3.0]
    assert seen[0][1] == '{"step":1,"of":3}'

    # Cancel: the SDK sends notifications/cancelled when the caller gives up; the kernel call
    # is cancelled (the sidecar stops sleeping) and the session goes on.
    with anyio.move_on_after(0.5):
        await session.call_tool("echo.sleep", {"seconds": 20, "steps": 200})
    started = time.monotonic()
    again = await session.call_tool("echo.say", {"text": "after cancel"})
    assert text_of(again) == "after cancel"
    assert time.monotonic() - started < 5

    # A crash of the sidecar mid-call is answered with isError (worker-crashed), at once.
    crashed = await session.call_tool("echo.crash", {})
    assert crashed.is_error is True
    assert crashed.structured_content["error"]["code"] in ("worker-crashed", "protocol-error")

    # Recovery: the flaky sidecar starts once its file exists; list_changed announces it.
    (root / "fixed").write_text("")
    await _wait_listed(session, "flaky.work", True, watcher)
    assert watcher.list_changed >= 1
    work = await session.call_tool("flaky.work", {})
    assert work.is_error is False


def test_mcp_stdio_against_running_host(app):
    _registry(app)
    with serve(app):

        async def main() -> None:
            watcher = Watcher()
            async with stdio_session(app, watcher=watcher) as session:
                await _scenario(session, watcher, app)

        anyio.run(main)


def test_mcp_stdio_embedded(app):
    _registry(app)

    async def main() -> None:
        watcher = Watcher()
        async with stdio_session(app, "--embedded", watcher=watcher) as session:
            assert session.initialize_result.protocol_version == "2025-11-25"
            assert session.initialize_result.server_info.name == "toolhost"
            await _scenario(session, watcher, app)

    anyio.run(main)
    assert not (app / ".toolhost" / "host.sock").exists()  # embedded: no socket file


def test_mcp_stdio_without_host_says_why(app):
    _registry(app)
    proc = subprocess.run(
        [*TOOLHOST, "mcp", "--app-root", str(app), "--no-global"],
        capture_output=True,
        text=True,
        input="",
        timeout=60,
    )
    assert proc.returncode != 0
    assert "no host listening" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_mcp_streamable_http_embedded(app):
    _registry(app)
    proc, url = start_http(app, "--embedded")
    try:
        token = (app / ".toolhost" / "mcp.token").read_text().strip()
        assert oct(os.stat(app / ".toolhost" / "mcp.token").st_mode & 0o777) == "0o600"

        async def main() -> None:
            watcher = Watcher()
            async with http_session(url, token, watcher) as session:
                await _scenario(session, watcher, app)

            async with httpx2.AsyncClient(timeout=30) as http:
                # Probes need no token.
                r = await http.get(url.replace("/mcp", "/readyz"))
                assert r.status_code == 200 and r.json()["ready"] is True
                init = {
                    "jsonrpc": "2.0",
                    "id": 1,
                    "method": "initialize",
                    "params": {"protocolVersion": "2024-11-05", "capabilities": {}},
                }
                accept = {"Accept": "application/json, text/event-stream"}
                # No token: 401 with a Bearer challenge.
                r = await http.post(url, json=init, headers=accept)
                assert r.status_code == 401
                assert r.headers["www-authenticate"].startswith("Bearer")
                auth = {**accept, "Authorization": f"Bearer {token}"}
                # A foreign Origin (DNS rebinding) is refused even with the token.
                r = await http.post(url, json=init, headers={**auth, "Origin": "http://evil.test"})
                assert r.status_code == 403
                # A request without a session, other than initialize: 400; unknown session: 404.
                call = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}
                r = await http.post(url, json=call, headers=auth)
                assert r.status_code == 400
                r = await http.post(url, json=call, headers={**auth, "Mcp-Session-Id": "nope"})
                assert r.status_code == 404
                # Negotiating down: an older revision is answered with itself.
                r = await http.post(
                    url, json=init, headers={**auth, "Origin": "http://localhost:1"}
                )
                assert r.status_code == 200
                assert r.json()["result"]["protocolVersion"] == "2024-11-05"
                sid = r.headers["mcp-session-id"]
                # Not JSON: a JSON-RPC parse error, not a crash.
                as_json = {**auth, "Mcp-Session-Id": sid, "Content-Type": "application/json"}
                r = await http.post(url, content=b"{oops", headers=as_json)
                assert r.json()["error"]["code"] == -32700
                r = await http.delete(url, headers={**auth, "Mcp-Session-Id": sid})
                assert r.status_code == 204
                r = await http.post(url, json=call, headers={**auth, "Mcp-Session-Id": sid})
                assert r.status_code == 404

        anyio.run(main)
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def test_mcp_http_waits_for_its_host(app):
    """Without --embedded the HTTP face starts before the host (a pod's two containers): 503 and
    a failing /healthz until ``toolhost serve`` listens, then sessions work."""
    _registry(app)
    proc, url = start_http(app)
    try:
        token = (app / ".toolhost" / "mcp.token").read_text().strip()
        auth = {"Authorization": f"Bearer {token}", "Accept": "application/json"}
        init = {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "initialize",
            "params": {"protocolVersion": "2025-11-25", "capabilities": {}},
        }

        async def before() -> None:
            async with httpx2.AsyncClient(timeout=30) as http:
                r = await http.post(url, json=init, headers=auth)
                assert r.status_code == 503
                r = await http.get(url.replace("/mcp", "/healthz"))
                assert r.status_code == 503 and r.json()["live"] is False

        anyio.run(before)
        with serve(app):

            async def after() -> None:
                watcher = Watcher()
                async with http_session(url, token, watcher) as session:
                    await _wait_listed(session, "echo.say", True, watcher)
                    result = await session.call_tool("echo.say", {"text": "late host"})
                    assert text_of(result) == "late host"

            anyio.run(after)
    finally:
        proc.terminate()
        proc.wait(timeout=20)
