"""SDK sidecars with ``--mcp`` are MCP stdio servers, driven here by the official MCP SDK client:
the sync ``echo`` fixture, the async ``aecho`` fixture and the bundled utility sidecar."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import anyio
from mcp import ClientSession, StdioServerParameters, stdio_client

from tests.conftest import FIXTURES, REPO
from tests.e2e.mcp_client import text_of


def _params(args: list[str], cwd: Path, env: dict[str, str]) -> StdioServerParameters:
    return StdioServerParameters(
        command=sys.executable,
        args=[*args, "--mcp"],
        cwd=str(cwd),
        env={"PYTHONPATH": str(REPO), **env},
    )


async def _session(args: list[str], cwd: Path, body, env: dict[str, str] | None = None) -> None:
    async with (
        stdio_client(_params(args, cwd, env or {})) as (read, write),
        ClientSession(read, write) as session,
    ):
        init = await session.initialize()
        assert init.protocol_version == "2025-11-25"
        await body(session, init)


def test_sync_sdk_sidecar_as_mcp_server(tmp_path):
    async def body(session, init):
        assert init.server_info.name == "echo"
        tools = {t.name: t for t in (await session.list_tools()).tools}
        assert set(tools) == {"echo.say", "echo.sleep", "echo.fail", "echo.crash", "echo.env"}
        assert tools["echo.say"].annotations.read_only_hint is True
        assert tools["echo.say"].input_schema["required"] == ["text"]

        said = await session.call_tool("echo.say", {"text": "hi"})
        assert (said.is_error, text_of(said)) == (False, "hi")
        assert said.structured_content["text"] == "hi"

        failed = await session.call_tool("echo.fail", {"code": "unavailable"})
        assert failed.is_error is True
        assert failed.structured_content["error"]["code"] == "unavailable"
        assert failed.structured_content["data"] == {"partial": 1}

        bad = await session.call_tool("echo.say", {"nope": 1})
        assert bad.is_error and text_of(bad).startswith("[invalid-input]")

        seen = []

        async def on_progress(progress, total, message):
            seen.append((progress, message))

        slept = await session.call_tool(
            "echo.sleep", {"seconds": 0.1, "steps": 2}, progress_callback=on_progress
        )
        assert slept.is_error is False
        assert seen == [(1.0, '{"step":1,"of":2}'), (2.0, '{"step":2,"of":2}')]

        # Cancel a sync tool: ctx.cancelled is set and its thread is free again (one call at a
        # time: the next call runs at once only if the cancel reached the tool).
        with anyio.move_on_after(0.3):
            await session.call_tool("echo.sleep", {"seconds": 30, "steps": 300})
        started = time.monotonic()
        again = await session.call_tool("echo.say", {"text": "still here"})
        assert text_of(again) == "still here"
        assert time.monotonic() - started < 5

    anyio.run(_session, [str(FIXTURES / "echo.py")], tmp_path, body, {"ECHO_CONCURRENCY": "1"})


def test_async_sdk_sidecar_as_mcp_server(tmp_path):
    marker = tmp_path / "cancelled.txt"

    async def body(session, init):
        names = {t.name for t in (await session.list_tools()).tools}
        assert {"aecho.say", "aecho.sleep", "aecho.sync", "aecho.add"} <= names
        said = await session.call_tool("aecho.say", {"text": "async"})
        assert text_of(said) == "async"
        assert said.structured_content["main"] is True  # on the loop's thread
        sync = await session.call_tool("aecho.sync", {"text": "s"})
        assert sync.structured_content == {"text": "s", "main": False}  # in a worker thread
        first = await session.call_tool("aecho.add", {"text": "abc"})
        second = await session.call_tool("aecho.add", {"text": "de"})
        assert (first.structured_content["total"], second.structured_content["total"]) == (3, 5)
        boom = await session.call_tool("aecho.boom", {})
        assert boom.is_error and "ValueError: boom" in text_of(boom)

        # Cancel an async tool: a real trio.Cancelled reaches it.
        with anyio.move_on_after(0.3):
            await session.call_tool(
                "aecho.sleep", {"seconds": 30, "steps": 300, "marker": str(marker)}
            )
        with anyio.fail_after(10):
            # The fixture writes the marker atomically (temp + rename): exists means complete.
            while not marker.exists():
                await session.send_ping()
        assert marker.read_text() == "cancelled"

    anyio.run(_session, [str(FIXTURES / "aecho.py")], tmp_path, body)


def test_bundled_utility_sidecar_as_mcp_server(tmp_path):
    (tmp_path / "data.txt").write_text("hello")

    async def body(session, init):
        tools = {t.name: t for t in (await session.list_tools()).tools}
        assert "file.hash" in tools
        assert tools["file.hash"].annotations.destructive_hint is False
        result = await session.call_tool("file.hash", {"path": "data.txt"})
        assert result.is_error is False, text_of(result)
        import hashlib

        assert hashlib.sha256(b"hello").hexdigest() in text_of(result) + str(
            result.structured_content
        )

    anyio.run(_session, ["-m", "sidecars.utility"], tmp_path, body)
