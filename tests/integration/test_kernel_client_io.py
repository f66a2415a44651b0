"""The kernel client's request path: a request is written by the task that makes it while the
socket takes it, and queued (in order) for the writer task when it does not; ``raw=True``
hands the result back as the JSON the host sent. Real host, real echo sidecar."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import msgspec
import pytest
import trio

from supervisor.client import Client, RpcError
from tests.conftest import echo, running_host, unix_client, wait_available


@asynccontextmanager
async def served_client(app: Path) -> AsyncIterator[Client]:
    """A kernel client on a host of two echo workers, over its Unix socket."""
    async with running_host(app, {"echo": echo(pool={"min": 2, "max": 2})}) as host:
        await wait_available(host, "echo.say")
        async with unix_client(host) as client:
            yield client


async def test_many_large_requests_at_once_each_gets_its_own_answer(app):
    async with served_client(app) as client:
        # 128 requests of 32 KiB: far more than the socket buffer holds, so most of
        # them wait for the writer task behind the first ones.
        texts = [f"{i:04d}" + "x" * (32 * 1024) for i in range(128)]
        got: dict[int, str] = {}

        async def say(i: int) -> None:
            env = await client.invoke("echo.say", {"text": texts[i]})
            assert env.status == "success", env.error
            got[i] = texts[i] if texts[i] in env.content else env.content[:40]

        async with trio.open_nursery() as calls:
            for i in range(len(texts)):
                calls.start_soon(say, i)
        assert got == dict(enumerate(texts))
        assert client._backlog == 0  # everything queued was sent

        raw = await client.request(
            "tools.invoke", {"tool": "echo.say", "input": {"text": "hi"}}, raw=True
        )
        assert isinstance(raw, msgspec.Raw)
        decoded = msgspec.json.decode(raw)
        assert decoded["status"] == "success" and decoded["content"] == "hi"
        with pytest.raises(RpcError) as exc:
            await client.request("no.such.method", {}, raw=True)
        assert exc.value.code == "unknown-method"


async def test_members_requests_split_the_result_once_and_leave_other_answers_alone(app):
    """``members=True`` hands back the result's members, each the JSON the host sent (what
    the MCP face passes on from a 1 MiB read); a plain request answered meanwhile is decoded
    as usual, and an error is still an ``RpcError``."""
    async with served_client(app) as client:
        big = "y" * (32 * 1024)
        got: dict[str, object] = {}

        async def split() -> None:
            got["members"] = await client.request(
                "tools.invoke",
                {"tool": "echo.say", "input": {"text": big}},
                members=True,
            )

        async def plain() -> None:
            got["plain"] = await client.invoke("echo.say", {"text": "plain"})

        async with trio.open_nursery() as both:
            both.start_soon(split)
            both.start_soon(plain)
        members = got["members"]
        assert isinstance(members, dict)
        assert all(isinstance(v, msgspec.Raw) for v in members.values())
        assert msgspec.json.decode(members["status"]) == "success"
        assert big in msgspec.json.decode(members["content"])  # as the host sent it
        plain_env = got["plain"]
        assert getattr(plain_env, "status", None) == "success"
        assert getattr(plain_env, "content", None) == "plain"
        assert client._members == 0 and client._raw == 0
        with pytest.raises(RpcError) as exc:
            await client.request("no.such.method", {}, members=True)
        assert exc.value.code == "unknown-method"
