"""``system.stats``: accounting per sidecar, per tool and per worker, sampled and counted."""

import trio

from supervisor.calls.call import InvokeRequest
from tests.conftest import echo, raw, running_host, wait_available, wait_for
from tests.kernel import served


async def test_stats_per_sidecar_tool_and_worker(app):
    # Exec'd: its interpreter start costs CPU the sampler must see; a worker forked from the
    # zygote may not use one clock tick (10 ms) for these calls.
    reg = {"echo": echo(pool={"min": 1, "max": 1}, spawn="exec")}
    async with running_host(app, reg, host={"statsIntervalMs": 100}) as host:
        await wait_available(host, "echo.say", "echo.crash")
        for i in range(20):
            assert (
                await host.invoker.invoke(InvokeRequest("echo.say", raw({"text": "x" * i})))
            ).status == "success"
        env = await host.invoker.invoke(
            InvokeRequest("echo.sleep", raw({"seconds": 5}), timeout_ms=100)
        )
        assert env.error.code == "timeout"
        assert (await host.invoker.invoke(InvokeRequest("echo.fail", raw({})))).status == "failed"
        assert (
            await host.invoker.invoke(InvokeRequest("nope.nothing", raw({})))
        ).status == "unavailable"
        await wait_available(host, "echo.say")  # the timed-out call's worker may be replaced
        sampler = host.usage.sampler
        with trio.fail_after(15):
            for _ in range(2):
                await sampler.ticked.wait()
        st = host.views.stats()
        say = st.tools["echo.say"]
        assert (say.sidecar, say.calls, say.success, say.failed) == ("echo", 20, 20, 0)
        assert say.bytesIn == sum(len(f'{{"text":"{"x" * i}"}}') for i in range(20))
        assert say.bytesOut > say.bytesIn
        lat = say.latency
        assert lat.count == 20 and 0 < lat.p50 <= lat.p90 <= lat.p99 <= lat.max
        assert say.cpuReportedCalls == 20 and say.cpuSeconds == say.cpuReportedSeconds
        assert st.tools["echo.sleep"].timeouts == 1 and st.tools["echo.sleep"].failed == 1
        assert st.tools["echo.fail"].failed == 1
        assert "nope.nothing" not in st.tools  # unknown names are not accounted
        side = st.sidecars["echo"]
        assert side.calls == 22 and side.success == 20 and side.timeouts == 1
        assert side.attempts == 22 and side.starts >= 1 and side.workers == 1
        assert side.cpuSeconds > 0 and side.rssBytes > 5 * 2**20
        assert side.peakRssBytes >= side.rssBytes
        (w,) = side.workerStats
        assert w.pid == host.pools["echo"].workers[0].pid and w.state == "ready"
        assert w.rssBytes > 5 * 2**20 and w.cpuSeconds > 0 and w.processes == 1
        assert st.samples >= 2 and st.sampleIntervalMs == 100
        assert st.host.rssBytes > 0 and st.host.maxConcurrentSpawns == 4
        # A crash shows up as a restart with its cause.
        crash = await host.invoker.invoke(InvokeRequest("echo.crash", raw({})))
        assert crash.error.code == "worker-crashed"
        await wait_for(host, lambda: host.pools["echo"].statistics().restarts >= 1)
        st = host.views.stats().sidecars["echo"]
        assert st.exits.get("crashed") == 1 and st.restarts >= 1


async def test_stats_over_the_socket(app):
    async with running_host(app, {"echo": echo(tools=["echo.say"])}) as host:
        await wait_available(host, "echo.say")
        async with served(host, app) as srv, srv.peer("unix-msgpack") as peer:
            env = await peer.request(
                1, "tools.invoke", {"tool": "echo.say", "input": {"text": "a"}}
            )
            assert env["result"]["status"] == "success"
            stats = (await peer.request(2, "system.stats"))["result"]
        assert set(stats) == {
            "uptimeMs",
            "sampleIntervalMs",
            "samples",
            "host",
            "sidecars",
            "tools",
        }
        side = stats["sidecars"]["echo"]
        for key in ("calls", "success", "failed", "unavailable", "timeouts", "latency"):
            assert key in side
        for key in ("cpuSeconds", "peakRssBytes", "restarts", "workers", "queued"):
            assert key in side
        assert side["latency"]["count"] == 1 and stats["tools"]["echo.say"]["calls"] == 1
