"""A request whose frame was read before the client hung up: if it changes state it runs to its
end (the answer goes nowhere); if it is read-only it may be dropped, and the host logs each drop
and why.

The client here writes its frames and closes its end with plain blocking socket calls, without
yielding to trio in between, so the host always reads the frames and the EOF together.
"""

from __future__ import annotations

import json
import logging
import socket
from pathlib import Path
from typing import Any

import trio

from tests.conftest import (
    echo,
    read_only_manifests,
    running_host,
    wait_available,
    wait_for,
    write_registry,
)
from tests.kernel import served


def write_and_close(sock: Path, *frames: dict[str, Any]) -> None:
    """Connect, write ``frames``, close: all before the host's next scheduling point."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.connect(str(sock))
        s.sendall(b"".join(json.dumps(f).encode() + b"\n" for f in frames))


def invoke(rid: int, tool: str, inp: dict[str, Any]) -> dict[str, Any]:
    return {"id": rid, "method": "tools.invoke", "params": {"tool": tool, "input": inp}}


def server_log(caplog: Any) -> str:
    return "\n".join(r.getMessage() for r in caplog.records if r.name == "toolhost.server")


async def until(pred: Any, timeout: float = 15) -> None:
    with trio.fail_after(timeout):
        while not pred():
            await trio.sleep(0.01)


def successes(host: Any, tool: str) -> int:
    stats = host.views.stats().tools.get(tool)
    return stats.success if stats is not None else 0


async def test_a_state_changing_invoke_read_before_eof_runs_to_its_end(app, caplog):
    caplog.set_level(logging.INFO, logger="toolhost.server")
    async with running_host(app, {"echo": echo(tools=["echo.sleep"])}) as host:
        await wait_available(host, "echo.sleep")
        async with served(host, app) as srv:
            write_and_close(srv.sock, invoke(7, "echo.sleep", {"seconds": 0.3, "steps": 3}))
            await until(lambda: successes(host, "echo.sleep") == 1)
            assert "request 7 (tools.invoke)" in server_log(caplog)
            assert "runs to its end" in server_log(caplog)


async def test_a_read_only_invoke_is_dropped_and_the_drop_logged(app, caplog):
    caplog.set_level(logging.INFO, logger="toolhost.server")
    manifests = read_only_manifests(app, ["echo.sleep"])
    reg = {"echo": echo(tools=["echo.sleep"])}
    async with running_host(app, reg, manifest_dirs=manifests) as host:
        await wait_available(host, "echo.sleep")
        async with served(host, app) as srv:
            write_and_close(srv.sock, invoke(8, "echo.sleep", {"seconds": 30, "steps": 600}))
            await until(lambda: "dropped request 8" in server_log(caplog))
            assert "(tools.invoke, running)" in server_log(caplog)
            assert "read-only" in server_log(caplog)
            pool = host.pools["echo"]
            await until(lambda: not pool.workers[0].inflight)  # cancelled, not 30 s of sleep
            assert successes(host, "echo.sleep") == 0


async def test_a_reload_read_before_eof_is_carried_out_and_a_queued_status_dropped(app, caplog):
    caplog.set_level(logging.INFO, logger="toolhost.server")
    async with running_host(app, {"a": echo(tools=["echo.say"])}) as host:
        await wait_available(host, "echo.say")
        write_registry(app, {"a": echo(tools=["echo.say"]), "b": echo(tools=["echo.fail"])})
        async with served(host, app) as srv:
            write_and_close(
                srv.sock,
                {"id": 1, "method": "registry.reload", "params": {}},
                {"id": 2, "method": "packages.status", "params": {}},
            )
            await wait_available(host, "echo.fail")
            await until(lambda: "dropped request 2 (packages.status, queued)" in server_log(caplog))
            assert "request 1 (registry.reload)" in server_log(caplog)
            await wait_for(host, lambda: "b" in host.pools)
