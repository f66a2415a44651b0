"""Per-client profiles of ``toolhost mcp``, with the official SDK client: ``--tools`` and
``--profile`` over stdio, and over Streamable HTTP a profile per bearer token
(``host.mcp.tokens``), so each client on one port sees its own slice; a call outside the slice is
an MCP error naming the profile; SIGHUP reads profiles and token files again."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import anyio
import httpx2
import pytest
from mcp.shared.exceptions import MCPError

from tests.conftest import echo, write_registry
from tests.e2e.conftest import TOOLHOST, stop
from tests.e2e.mcp_client import http_client_in, start_http, stdio_client_in, text_of

pytestmark = pytest.mark.slow

PROFILE_TLAK = ("--profile", "tlak")
ALL = {"echo.crash", "echo.env", "echo.fail", "echo.say", "echo.sleep"}


def _registry(root: Path, profiles: dict, tokens: dict | None = None) -> Path:
    mcp: dict = {"profiles": profiles}
    if tokens is not None:
        mcp["tokens"] = tokens
    return write_registry(root, {"echo": echo()}, host={"mcp": mcp})


async def _names(client) -> set[str]:
    with anyio.fail_after(30):
        while True:
            names = {t.name for t in (await client.list_tools()).tools}
            if names:
                return names
            await anyio.sleep(0.1)


async def _refused(client, tool: str, profile: str) -> None:
    with pytest.raises(MCPError) as exc:
        await client.call_tool(tool, {})
    assert str(exc.value) == f"tool {tool!r} is not in profile {profile!r}"
    assert exc.value.error.data == {"profile": profile}


@pytest.mark.parametrize("mode", ["auto", "legacy"])
def test_stdio_tools_patterns(app, mode):
    _registry(app, {})

    async def main() -> None:
        async with stdio_client_in(app, "--embedded", "--tools", "echo.s*", mode=mode) as client:
            assert await _names(client) == {"echo.say", "echo.sleep"}
            said = await client.call_tool("echo.say", {"text": "in"})
            assert text_of(said) == "in"
            await _refused(client, "echo.env", "--tools echo.s*")
            # The refusal is ours, made before the host is asked: the session goes on.
            assert text_of(await client.call_tool("echo.say", {"text": "on"})) == "on"

    anyio.run(main)


def test_stdio_registry_profile_and_an_unknown_one(app):
    _registry(app, {"talk": {"tools": ["echo.say", "echo.fail"]}})

    async def main() -> None:
        async with stdio_client_in(app, "--embedded", "--profile", "talk", mode="auto") as client:
            assert await _names(client) == {"echo.say", "echo.fail"}
            await _refused(client, "echo.sleep", "talk")

    anyio.run(main)
    proc = subprocess.run(
        [*TOOLHOST, "mcp", "--app-root", str(app), "--no-global", "--embedded", *PROFILE_TLAK],
        capture_output=True,
        text=True,
        input="",
        timeout=60,
        env={**os.environ, "XDG_CONFIG_HOME": str(app / ".xdg")},
    )
    assert proc.returncode == 64  # EXIT_USAGE
    assert "no profile 'tlak' in host.mcp.profiles (profiles: talk)" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_http_each_token_gets_its_slice_and_sighup_reloads_them(app):
    registry = _registry(
        app,
        {"talk": {"tools": ["echo.say"]}, "work": {"tools": ["echo.sleep", "echo.say"]}},
        {"ci": {"tokenFile": ".toolhost/ci.token", "profile": "talk"}},
    )
    proc, url = start_http(app, "--embedded")
    try:
        default = (app / ".toolhost" / "mcp.token").read_text().strip()
        ci = (app / ".toolhost" / "ci.token").read_text().strip()
        assert oct(os.stat(app / ".toolhost" / "ci.token").st_mode & 0o777) == "0o600"

        async def before() -> None:
            for mode in ("auto", "legacy"):
                async with http_client_in(url, default, mode=mode) as client:
                    assert await _names(client) == ALL
                async with http_client_in(url, ci, mode=mode) as client:
                    assert await _names(client) == {"echo.say"}
                    assert text_of(await client.call_tool("echo.say", {"text": "ci"})) == "ci"
                    await _refused(client, "echo.sleep", "talk")
            # A handshake session belongs to the token that opened it.
            async with httpx2.AsyncClient(timeout=30) as http:
                init = {
                    "jsonrpc": "2.0",
                    "id": 1,
                    "method": "initialize",
                    "params": {"protocolVersion": "2025-11-25", "capabilities": {}},
                }
                accept = {"Accept": "application/json, text/event-stream"}
                r = await http.post(
                    url, json=init, headers={**accept, "Authorization": f"Bearer {default}"}
                )
                sid = r.headers["mcp-session-id"]
                call = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}
                as_ci = {**accept, "Authorization": f"Bearer {ci}", "Mcp-Session-Id": sid}
                r = await http.post(url, json=call, headers=as_ci)
                assert r.status_code == 404

        anyio.run(before)

        # Reload: ci's profile widens, a new token appears, the old default token stays.
        doc = json.loads(registry.read_text())
        doc["host"]["mcp"]["tokens"] = {
            "ci": {"tokenFile": ".toolhost/ci.token", "profile": "work"},
            "ops": {"tokenFile": ".toolhost/ops.token"},
        }
        registry.write_text(json.dumps(doc))
        proc.send_signal(signal.SIGHUP)
        ops_file = app / ".toolhost" / "ops.token"

        async def after() -> None:
            with anyio.fail_after(30):
                while not ops_file.exists():
                    await anyio.sleep(0.05)
            ops = ops_file.read_text().strip()
            async with http_client_in(url, ci, mode="auto") as client:
                with anyio.fail_after(30):
                    while await _names(client) != {"echo.say", "echo.sleep"}:
                        await anyio.sleep(0.1)
            async with http_client_in(url, ops, mode="auto") as client:
                assert await _names(client) == ALL

        anyio.run(after)

        # Reload: ci is gone; its token is refused (401).
        doc["host"]["mcp"]["tokens"].pop("ci")
        registry.write_text(json.dumps(doc))
        proc.send_signal(signal.SIGHUP)

        async def gone() -> None:
            async with httpx2.AsyncClient(timeout=30) as http:
                with anyio.fail_after(30):
                    while True:
                        r = await http.post(
                            url,
                            json={"jsonrpc": "2.0", "id": 1, "method": "server/discover"},
                            headers={"Authorization": f"Bearer {ci}"},
                        )
                        if r.status_code == 401:
                            break
                        await anyio.sleep(0.1)

        anyio.run(gone)
        assert proc.poll() is None  # SIGHUP reloads; it does not stop the server
    finally:
        stop(proc)


def test_http_a_token_naming_no_profile_is_refused_and_said_at_start(app):
    _registry(
        app, {"talk": {"tools": ["echo.say"]}}, {"ci": {"tokenFile": "ci.token", "profile": "tlak"}}
    )
    head: list[str] = []
    proc, _ = start_http(app, "--embedded", head=head)
    try:
        assert not (app / "ci.token").exists()  # never read: its clients are never let in
    finally:
        stop(proc)
    assert any("host.mcp.tokens.ci.profile: no profile 'tlak'" in line for line in head), head
