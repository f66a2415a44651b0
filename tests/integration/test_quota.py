"""Call quotas end to end: refusals with a correct ``retryAfterMs``, the snapshot's
``sandbox: quota-limited`` flip and its return, concurrency, and daily counts that survive a
host restart.

Windows are a minute long, so the flip-back test runs on trio's MockClock: real time until the
window is full, then the clock jumps over idle stretches (no sampler or probe ticks in between)."""

import json
import time

import pytest
import trio

from supervisor.calls.call import InvokeRequest
from supervisor.policy.quota import DAY_MS
from tests.conftest import echo, raw, running_host, wait_available, wait_for

NO_TICKS = {"probe": {"intervalMs": 0}}
QUIET = {"statsIntervalMs": 600_000}


def quota_echo(quota, **extra):
    return echo(tools=["echo.say", "echo.sleep"], quota=quota, **NO_TICKS, **extra)


def say(host, text="hi"):
    return host.invoker.invoke(InvokeRequest("echo.say", raw({"text": text})))


@pytest.mark.parametrize("allow_degraded", [False, True])
async def test_rate_quota_refuses_then_flips_back(app, mock_clock, allow_degraded):
    mock_clock.rate = 1.0
    reg = {
        "good": echo(tools=["echo.env"], **NO_TICKS),
        "q": quota_echo({"tools": {"echo.say": {"callsPerMinute": 3}}}),
    }
    host_cfg = {**QUIET, "allowDegraded": allow_degraded}
    async with running_host(app, reg, host=host_cfg) as host:
        await wait_available(host, "echo.say", "echo.env")
        rev = host.catalog.revision
        t0 = trio.current_time()
        for i in range(3):
            assert (await say(host, str(i))).status == "success"
        t1 = trio.current_time()
        # The third call filled the window: the snapshot says so before anyone is refused.
        d = host.catalog.get("echo.say")
        assert d.stability.sandbox == "quota-limited" and d.stability.effective == "degraded"
        assert d.visible is allow_degraded
        assert host.catalog.revision > rev
        assert 0 < d.stability.details.retryAfterMs <= 60_000
        assert host.catalog.get("echo.sleep").stability.sandbox == "allowed"  # tool quota only
        before = trio.current_time()
        env = await say(host, "one too many")
        after = trio.current_time()
        assert env.status == "unavailable" and env.error.code == "quota-limited"
        retry = env.error.details["retryAfterMs"]
        # The oldest call leaves the window 60 s after it was admitted (between t0 and t1).
        assert 60_000 - (after - t0) * 1000 - 1 <= retry <= 60_000 - (before - t1) * 1000 + 1
        # Visible (the ledger refused it) or hidden (the gate did): the rule and limit are named
        # as docs/quotas-and-limits.md shows them.
        assert env.error.details["rule"] == "callsPerMinute"
        assert env.error.details["limit"] == 3
        assert env.error.details["scope"] == "tool:echo.say"
        assert env.content == (
            f"echo.say: quota.tools.echo.say.callsPerMinute=3 reached; retry in {retry} ms"
        )
        assert (
            await host.invoker.invoke(InvokeRequest("echo.sleep", raw({"seconds": 0})))
        ).status == "success"
        assert host.views.stats().tools["echo.say"].quotaLimited == 1
        # Jump over the idle minute: the host's timer flips the tool back on time.
        mock_clock.autojump_threshold = 0.1
        d = await wait_for(
            host,
            lambda: (d := host.catalog.get("echo.say")).stability.sandbox == "allowed" and d,
            timeout=600,
        )
        mock_clock.autojump_threshold = float("inf")
        assert trio.current_time() - t0 >= 60.0
        assert d.visible and d.stability.details.retryAfterMs is None
        assert (await say(host, "again")).status == "success"


async def test_sidecar_quota_limits_every_tool(app):
    reg = {"q": quota_echo({"callsPerMinute": 2})}
    async with running_host(app, reg, host=QUIET) as host:
        await wait_available(host, "echo.say", "echo.sleep")
        assert (await say(host)).status == "success"
        assert (
            await host.invoker.invoke(InvokeRequest("echo.sleep", raw({"seconds": 0})))
        ).status == "success"
        for tool in ("echo.say", "echo.sleep"):
            assert host.catalog.get(tool).stability.sandbox == "quota-limited"
        env = await say(host)
        assert env.error.code == "quota-limited" and env.error.details["retryAfterMs"] > 50_000
        assert host.views.stats().sidecars["q"].limitedTools == ["echo.say", "echo.sleep"]


async def test_max_concurrent_refuses_without_flipping_the_snapshot(app):
    reg = {"q": quota_echo({"tools": {"echo.sleep": {"maxConcurrent": 1}}})}
    async with running_host(app, reg, host=QUIET) as host:
        await wait_available(host, "echo.sleep")
        rev = host.catalog.revision
        done = trio.Event()
        running = trio.Event()

        async def long_call():
            env = await host.invoker.invoke(
                InvokeRequest("echo.sleep", raw({"seconds": 0.5, "steps": 2})),
                on_progress=lambda _: running.set(),
            )
            assert env.status == "success"
            done.set()

        async with trio.open_nursery() as n:
            n.start_soon(long_call)
            with trio.fail_after(15):
                await running.wait()
            env = await host.invoker.invoke(InvokeRequest("echo.sleep", raw({"seconds": 0})))
            assert env.status == "unavailable" and env.error.code == "quota-limited"
            assert env.error.details["rule"] == "maxConcurrent"
            assert env.error.details["retryAfterMs"] >= 1
            assert host.catalog.get("echo.sleep").stability.sandbox == "allowed"
            assert host.catalog.revision == rev
            await done.wait()
        assert (
            await host.invoker.invoke(InvokeRequest("echo.sleep", raw({"seconds": 0})))
        ).status == "success"


async def test_calls_per_day_survive_a_host_restart(app):
    reg = {"q": quota_echo({"tools": {"echo.say": {"callsPerDay": 2}}})}
    async with running_host(app, reg, host=QUIET) as host:
        await wait_available(host, "echo.say")
        assert (await say(host)).status == "success"
        assert (await say(host)).status == "success"
        env = await say(host)
        assert env.error.code == "quota-limited"
        to_midnight = DAY_MS - (time.time() * 1000) % DAY_MS
        assert abs(env.error.details["retryAfterMs"] - to_midnight) < 5_000
    state = json.loads((app / ".toolhost" / "quota-state.json").read_text())
    assert state["counts"] == {"tool:echo.say": 2}
    assert state["day"] == int(time.time() * 1000 // DAY_MS)
    # A new host on the same app root remembers today's count.
    async with running_host(app, None) as host:
        await wait_for(host, lambda: host.catalog.get("echo.say").stability.runtime == "ready")
        d = host.catalog.get("echo.say")
        assert d.stability.sandbox == "quota-limited" and not d.visible
        env = await say(host)
        assert env.status == "unavailable" and env.error.code == "quota-limited"
        assert env.error.details["retryAfterMs"] > 0
        assert host.views.stats().tools["echo.say"].quota == {"callsToday": 2}
