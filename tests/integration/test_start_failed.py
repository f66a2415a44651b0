"""PROTOCOL 4: the restart window covers starting a replacement, not a sidecar that cannot
start. Once a replacement's start fails (the process exits before ``ready``, the connection is
refused), the tool is ``runtime: failed`` (reason ``start-failed``, ``details.nextRestartMs``),
calls that waited for the replacement are answered at once, and the tool is ``ready`` again
after the next successful start. The restart intensity is set high on purpose (as an operator
would for a remote server that comes back): it is not what ends the window."""

import os
import signal

import trio

from supervisor.calls.call import InvokeRequest
from tests.conftest import (
    effective,
    free_port,
    raw,
    ready_pids,
    running_host,
    script,
    wait_available,
    wait_for,
)
from tests.integration.test_mcp import fixture_server
from tests.integration.test_mcp_http import entry as http_entry
from tests.integration.test_mcp_http import http_server

PATIENT = {"intensity": 1000, "periodMs": 60_000, "backoffMs": 100, "maxBackoffMs": 300}


def stability(host, tool):
    return host.catalog.get(tool).stability


async def until_start_failed(host, tool):
    """Wait for the start-failed verdict, and for a moment when the next attempt is scheduled
    (``nextRestartMs``); check what the snapshot says then."""
    await wait_for(
        host,
        lambda: (
            stability(host, tool).details.nextRestartMs is not None
            and stability(host, tool).runtime == "failed"
        ),
    )
    s = stability(host, tool)
    assert s.effective == "unavailable" and not s.details.restarting
    (reason,) = [r for r in s.reasons if r.field == "runtime"]
    assert reason.code == "start-failed", s.reasons
    assert "cannot start" in reason.message and "retrying in" in reason.message
    assert not host.catalog.get(tool).visible


async def refused_at_once(host, tool):
    t0 = trio.current_time()
    with trio.fail_after(5):
        env = await host.invoker.invoke(InvokeRequest(tool, raw({}), timeout_ms=30_000))
    assert env.status == "unavailable", env
    return trio.current_time() - t0


async def test_process_json_replacement_that_exits_before_ready(app, tmp_path):
    fail = tmp_path / "cannot-start"
    entry = script(
        "second_life",
        ["life.pid", "life.crash"],
        env={"LIFE_FAIL_FILE": str(fail), "LIFE_FAIL_AFTER": "0.5"},
        restart=PATIENT,
        timeoutMs=30_000,
    )
    async with running_host(app, {"life": entry}) as host:
        await wait_available(host, "life.pid")
        first = ready_pids(host, "life")[0]
        fail.touch()
        env = await host.invoker.invoke(InvokeRequest("life.crash", raw({})))
        assert env.error.code == "worker-crashed"
        # Made in the restart window: it waits for the replacement, and is answered as soon as
        # the replacement failed to start (0.5 s), not at its 30 s deadline.
        t0 = trio.current_time()
        with trio.fail_after(10):
            env = await host.invoker.invoke(InvokeRequest("life.pid", raw({}), timeout_ms=30_000))
        assert env.status == "unavailable" and env.error.code == "unavailable", env
        assert "cannot start" in env.error.message or "failing" in env.error.message
        assert "exited before ready" in env.error.message
        assert trio.current_time() - t0 < 5
        await until_start_failed(host, "life.pid")
        assert await refused_at_once(host, "life.pid") < 1
        fail.unlink()
        await wait_available(host, "life.pid")
        s = stability(host, "life.pid")
        assert s.runtime == "ready" and not s.reasons and s.details.restarts >= 2
        env = await host.invoker.invoke(InvokeRequest("life.pid", raw({})))
        assert env.status == "success" and env.meta.pid not in (first, None)


async def test_mcp_stdio_replacement_that_exits_before_initialize(app, tmp_path):
    fail = tmp_path / "cannot-start"
    entry = fixture_server(tools=["whoami"], env={"FIXTURE_FAIL_FILE": str(fail)}, restart=PATIENT)
    async with running_host(app, {"mcp": entry}) as host:
        await wait_available(host, "whoami")
        first = ready_pids(host, "mcp")[0]
        fail.touch()
        os.kill(first, signal.SIGKILL)
        await until_start_failed(host, "whoami")
        assert "exited before ready" in stability(host, "whoami").reasons[0].message
        assert await refused_at_once(host, "whoami") < 1
        fail.unlink()
        await wait_available(host, "whoami", timeout=30)
        assert stability(host, "whoami").runtime == "ready"
        assert (await host.invoker.invoke(InvokeRequest("whoami", raw({})))).status == "success"


async def test_mcp_http_server_killed_then_back(app, tmp_path):
    port = free_port()
    with http_server(tmp_path, port=port) as server:
        await server.listening()
        async with running_host(app, {"remote": http_entry(port, restart=PATIENT)}) as host:
            await wait_available(host, "whoami")
            server.kill()
            await until_start_failed(host, "whoami")
            assert "cannot connect" in stability(host, "whoami").reasons[0].message
            assert await refused_at_once(host, "whoami") < 1
            assert effective(host, "whoami") == "unavailable"
            server.start()
            await wait_available(host, "whoami", timeout=30)
            assert (await host.invoker.invoke(InvokeRequest("whoami", raw({})))).status == "success"
