"""The restart window (PROTOCOL 4): a crash inside the restart intensity keeps the sidecar ready
and visible, calls wait for the replacement, and an operator restart takes effect at once, also
during a backoff or after the sidecar failed."""

import os
import signal

import trio

from supervisor.calls.call import InvokeRequest
from tests.conftest import (
    echo,
    effective,
    raw,
    ready_pids,
    running_host,
    wait_available,
    wait_for,
    wait_replaced,
)
from tests.kernel import served

CALLS = 64


async def test_kill_a_worker_under_64_calls_in_flight(app):
    # The SDK default: one worker of concurrency 1; everything else queues behind it.
    sidecars = {
        "echo": echo(
            tools=["echo.say", "echo.sleep"],
            env={"ECHO_CONCURRENCY": "1"},
            pool={"min": 1, "max": 1, "queue": 128},
            timeoutMs=20_000,
        )
    }
    async with running_host(app, sidecars) as host:
        await wait_available(host, "echo.sleep")
        first = ready_pids(host, "echo")[0]
        async with served(host, app) as srv, srv.peer("unix-json") as peer:
            rev = (await peer.request(0, "capability.catalog.subscribe"))["result"]["revision"]
            for i in range(1, CALLS + 1):
                await peer.send(
                    {
                        "id": i,
                        "method": "tools.invoke",
                        "params": {"tool": "echo.sleep", "input": {"seconds": 0.01}},
                    }
                )
            answers: dict[int, dict] = {}
            events = []
            killed_at = None
            with trio.fail_after(30):
                while len(answers) < CALLS:
                    msg = await peer.recv()
                    if "event" in msg:
                        events.append(msg)
                        continue
                    assert msg["id"] not in answers, f"answered twice: {msg}"
                    answers[msg["id"]] = msg["result"]
                    if len(answers) == 8 and killed_at is None:
                        os.kill(first, signal.SIGKILL)
                        killed_at = trio.current_time()
        statuses = [(a["status"], (a.get("error") or {}).get("code")) for a in answers.values()]
        assert sorted(answers) == list(range(1, CALLS + 1))
        assert not [s for s in statuses if s[1] == "not-visible"]
        failed = [s for s in statuses if s[0] != "success"]
        # Only the call running at the kill fails (echo.sleep is not read-only: never retried).
        assert failed == [("failed", "worker-crashed")], statuses
        assert all(a["meta"]["durationMs"] < 20_000 for a in answers.values())
        assert [e for e in events if e["event"] == "catalog.changed"] == []
        assert host.catalog.revision == rev
        assert effective(host, "echo.sleep") == "available"
        new = ready_pids(host, "echo")
        assert new and first not in new
        d = host.catalog.get("echo.sleep").stability.details
        assert d.restarts == 1 and d.lastExitReason == "crashed" and not d.restarting
        assert host.views.stats().sidecars["echo"].queued == 0


async def test_calls_made_in_the_window_wait_for_the_replacement(app):
    sidecars = {
        "echo": echo(
            tools=["echo.say", "echo.crash"],
            env={"ECHO_CONCURRENCY": "1"},
            restart={"backoffMs": 300, "maxBackoffMs": 300},
        )
    }
    async with running_host(app, sidecars) as host:
        await wait_available(host, "echo.say")
        first = ready_pids(host, "echo")[0]
        env = await host.invoker.invoke(InvokeRequest("echo.crash", raw({})))
        assert env.error.code == "worker-crashed"
        pool = host.pools["echo"]
        await wait_for(host, lambda: pool.statistics().next_restart_ms is not None)
        d = host.catalog.get("echo.say").stability.details
        assert d.restarting and effective(host, "echo.say") == "available"
        assert pool.status().runtime == "backoff" or pool.facts().runtime == "ready"
        env = await host.invoker.invoke(InvokeRequest("echo.say", raw({"text": "waited"})))
        assert env.status == "success" and env.data is not None and env.meta.pid != first
        assert not host.catalog.get("echo.say").stability.details.restarting


async def crash_past_the_intensity(host):
    """intensity 1: the second crash in the period gives up (then retried every 60 s)."""
    await wait_available(host, "echo.say")
    first = ready_pids(host, "echo")[0]
    await host.invoker.invoke(InvokeRequest("echo.crash", raw({})))
    await wait_replaced(host, "echo", first)
    assert effective(host, "echo.say") == "available"
    await host.invoker.invoke(InvokeRequest("echo.crash", raw({})))
    await wait_for(host, lambda: effective(host, "echo.say") == "unavailable")


async def test_past_the_intensity_the_queue_is_refused_and_the_tool_leaves(app):
    sidecars = {
        "echo": echo(
            tools=["echo.say", "echo.crash"],
            restart={"intensity": 1, "backoffMs": 20, "maxBackoffMs": 60_000},
        )
    }
    async with running_host(app, sidecars) as host:
        await crash_past_the_intensity(host)
        d = host.catalog.get("echo.say")
        assert d.stability.runtime == "failed"
        assert d.stability.reasons[0].code == "gave-up"
        env = await host.invoker.invoke(InvokeRequest("echo.say", raw({"text": "x"})))
        assert env.status == "unavailable" and env.error.code == "not-visible"


async def test_restart_takes_effect_during_a_long_backoff(app):
    # the test host is seeded: its backoff draw from the 30 s ceiling is about 17 s
    sidecars = {
        "echo": echo(
            tools=["echo.say", "echo.crash"],
            restart={"backoffMs": 30_000, "maxBackoffMs": 30_000},
        )
    }
    async with running_host(app, sidecars) as host:
        await wait_available(host, "echo.say")
        first = ready_pids(host, "echo")[0]
        await host.invoker.invoke(InvokeRequest("echo.crash", raw({})))
        pool = host.pools["echo"]
        await wait_for(host, lambda: pool.statistics().next_restart_ms is not None)
        assert pool.statistics().next_restart_ms > 5_000
        t0 = trio.current_time()
        assert await host.restart_sidecar("echo")
        with trio.fail_after(10):
            await wait_replaced(host, "echo", first)
        assert trio.current_time() - t0 < 10
        env = await host.invoker.invoke(InvokeRequest("echo.say", raw({"text": "back"})))
        assert env.status == "success"


async def test_restart_takes_effect_after_the_sidecar_failed(app):
    sidecars = {
        "echo": echo(
            tools=["echo.say", "echo.crash"],
            restart={"intensity": 1, "backoffMs": 20, "maxBackoffMs": 60_000},
        )
    }
    async with running_host(app, sidecars) as host:
        await crash_past_the_intensity(host)
        assert await host.restart_sidecar("echo")
        with trio.fail_after(10):
            await wait_available(host, "echo.say")
        env = await host.invoker.invoke(InvokeRequest("echo.say", raw({"text": "back"})))
        assert env.status == "success"
