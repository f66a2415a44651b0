"""The official MCP Python SDK as the client of ``toolhost mcp`` (stdio and Streamable HTTP).

The SDK runs on anyio's asyncio backend in these tests (``anyio.run``), apart from the trio
tests, so nothing of the host's event loop is shared with the client.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.client.client import Client
from mcp.client.streamable_http import streamable_http_client

TOOLHOST = [sys.executable, "-m", "supervisor"]


class Watcher:
    """Counts ``notifications/tools/list_changed`` and lets a test wait for the next one."""

    def __init__(self) -> None:
        self.list_changed = 0
        self._event = anyio.Event()

    async def __call__(self, message: Any) -> None:
        method = getattr(getattr(message, "root", message), "method", None)
        if method == "notifications/tools/list_changed":
            self.list_changed += 1
            self._event.set()
            self._event = anyio.Event()

    async def beyond(self, seen: int, timeout: float = 30) -> None:
        """Wait until more than ``seen`` notifications have arrived."""
        with anyio.fail_after(timeout):
            while self.list_changed <= seen:
                await self._event.wait()


@asynccontextmanager
async def stdio_session(
    root: Path, *extra: str, watcher: Watcher | None = None
) -> AsyncIterator[ClientSession]:
    """``toolhost mcp [extra]`` spawned by the SDK's stdio client, initialized."""
    params = StdioServerParameters(
        command=TOOLHOST[0],
        args=[*TOOLHOST[1:], "mcp", "--app-root", str(root), "--no-global", *extra],
        env={**os.environ, "XDG_CONFIG_HOME": str(root / ".xdg")},
        cwd=str(root),
    )
    async with (
        stdio_client(params) as (read, write),
        ClientSession(read, write, message_handler=watcher) as session,
    ):
        await session.initialize()
        yield session


@asynccontextmanager
async def http_session(
    url: str, token: str, watcher: Watcher | None = None
) -> AsyncIterator[ClientSession]:
    """An SDK Streamable HTTP session with the bearer token, initialized."""
    client = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=60)
    async with (
        client,
        streamable_http_client(url, http_client=client) as streams,
        ClientSession(streams[0], streams[1], message_handler=watcher) as session,
    ):
        await session.initialize()
        yield session


def _stdio_params(root: Path, *extra: str) -> StdioServerParameters:
    return StdioServerParameters(
        command=TOOLHOST[0],
        args=[*TOOLHOST[1:], "mcp", "--app-root", str(root), "--no-global", *extra],
        env={**os.environ, "XDG_CONFIG_HOME": str(root / ".xdg")},
        cwd=str(root),
    )


@asynccontextmanager
async def stdio_client_in(
    root: Path, *extra: str, mode: str, watcher: Watcher | None = None
) -> AsyncIterator[Client]:
    """``toolhost mcp [extra]`` behind the SDK's high-level ``Client`` in ``mode``: ``auto``
    (``server/discover``, the handshake as its fallback), a pinned stateless revision, or
    ``legacy`` (the handshake)."""
    async with Client(_stdio_params(root, *extra), mode=mode, message_handler=watcher) as client:
        yield client


@asynccontextmanager
async def http_client_in(
    url: str, token: str, *, mode: str, watcher: Watcher | None = None
) -> AsyncIterator[Client]:
    """The SDK's high-level ``Client`` over Streamable HTTP with the bearer token, in ``mode``."""
    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=60)
    async with (
        http,
        Client(
            streamable_http_client(url, http_client=http), mode=mode, message_handler=watcher
        ) as client,
    ):
        yield client


def text_of(result: Any) -> str:
    return "\n".join(getattr(block, "text", "") for block in result.content)


def start_http(
    root: Path, *extra: str, registry: Path | None = None, head: list[str] | None = None
) -> tuple[subprocess.Popen[bytes], str]:
    """``toolhost mcp --http 127.0.0.1:0 [extra]`` started; its process and its ``/mcp`` URL
    (``head`` gets the stderr lines before the one naming it)."""
    more = ["--registry", str(registry)] if registry is not None else []
    where = ["--app-root", str(root), "--no-global", *more]
    proc = subprocess.Popen(
        [*TOOLHOST, "mcp", *where, "--http", "127.0.0.1:0", *extra],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env={**os.environ, "XDG_CONFIG_HOME": str(root / ".xdg")},
    )
    assert proc.stderr is not None
    for raw in proc.stderr:
        match = re.search(rb"(http://\S+/mcp)", raw)
        if match:
            return proc, match.group(1).decode()
        if head is not None:
            head.append(raw.decode(errors="replace"))
    proc.kill()
    proc.wait()
    pytest.fail("toolhost mcp --http did not start")
