"""Pool behaviour with real processes: queueing, scaling, recycling, probes, crash loops."""

import msgspec
import trio

from supervisor.calls.call import InvokeRequest
from tests.conftest import echo, raw, running_host, script, wait_available, wait_for


def pids_of(envs):
    return {e.meta.pid for e in envs}


async def test_queue_bound_answers_overloaded(app):
    cfg = echo(env={"ECHO_CONCURRENCY": "1"}, pool={"min": 1, "max": 1, "queue": 2})
    async with running_host(app, {"echo": cfg}) as host:
        await wait_available(host, "echo.sleep")
        results = []
        started = trio.Event()

        async def call(i):
            env = await host.invoker.invoke(
                InvokeRequest("echo.sleep", raw({"seconds": 0.4, "steps": 4})),
                on_progress=lambda _: started.set(),
            )
            results.append(env)

        async with trio.open_nursery() as n:
            n.start_soon(call, 0)
            with trio.fail_after(10):
                await started.wait()
            n.start_soon(call, 1)
            n.start_soon(call, 2)
            while host.pools["echo"].queued < 2:
                await trio.sleep(0)
            env = await host.invoker.invoke(InvokeRequest("echo.say", raw({"text": "x"})))
            assert env.status == "unavailable" and env.error.code == "overloaded"
            assert "pool.queue=2" in env.error.message
        assert [e.status for e in results] == ["success"] * 3
        assert host.views.stats().sidecars["echo"].overloaded == 1


async def test_scale_up_on_queue_then_idle_retire(app):
    cfg = echo(env={"ECHO_CONCURRENCY": "1"}, pool={"min": 1, "max": 2, "idleMs": 300})
    async with running_host(app, {"echo": cfg}) as host:
        await wait_available(host, "echo.sleep")
        envs = []

        async def call(seconds: float):
            envs.append(
                await host.invoker.invoke(InvokeRequest("echo.sleep", raw({"seconds": seconds})))
            )

        # The first call holds the only worker far longer than a worker takes to start (even on
        # a loaded machine), so the queued second call is served by a second worker.
        async with trio.open_nursery() as n:
            n.start_soon(call, 3.0)
            with trio.fail_after(15):  # inflight is no catalog change: poll it
                while not any(w.inflight for w in host.pools["echo"].workers):
                    await trio.sleep(0.01)
            n.start_soon(call, 0.01)
        assert [e.status for e in envs] == ["success", "success"]
        assert len(pids_of(envs)) == 2  # the second call got a second worker
        await wait_for(host, lambda: len(host.pools["echo"].workers) == 1, timeout=10)
        assert host.pools["echo"].statistics().restarts == 0  # retiring is not a restart


async def test_least_loaded_dispatch(app):
    cfg = echo(env={"ECHO_CONCURRENCY": "4"}, pool={"min": 2, "max": 2})
    async with running_host(app, {"echo": cfg}) as host:
        await wait_for(
            host, lambda: sum(w.state == "ready" for w in host.pools["echo"].workers) == 2
        )
        envs = []

        async def call():
            envs.append(
                await host.invoker.invoke(InvokeRequest("echo.sleep", raw({"seconds": 0.3})))
            )

        async with trio.open_nursery() as n:
            for _ in range(4):
                n.start_soon(call)
        counts = {}
        for e in envs:
            counts[e.meta.pid] = counts.get(e.meta.pid, 0) + 1
        assert sorted(counts.values()) == [2, 2]


async def test_max_calls_per_worker_recycles(app):
    cfg = echo(pool={"maxCallsPerWorker": 3})
    async with running_host(app, {"echo": cfg}) as host:
        await wait_available(host, "echo.say")
        envs = []
        for i in range(3):
            envs.append(await host.invoker.invoke(InvokeRequest("echo.say", raw({"text": str(i)}))))
        assert len(pids_of(envs)) == 1
        await wait_for(
            host,
            lambda: any(
                w.pid not in pids_of(envs) and w.state == "ready"
                for w in host.pools["echo"].workers
            ),
        )
        env = await host.invoker.invoke(InvokeRequest("echo.say", raw({"text": "after"})))
        assert env.status == "success" and env.meta.pid not in pids_of(envs)
        assert host.pools["echo"].statistics().restarts == 0


async def test_min_zero_verifies_then_scales_to_zero_and_back(app):
    cfg = echo(pool={"min": 0, "max": 1, "idleMs": 200})
    async with running_host(app, {"echo": cfg}) as host:
        await wait_available(host, "echo.say")
        await wait_for(host, lambda: not host.pools["echo"].workers, timeout=10)
        d = host.catalog.get("echo.say")
        assert d.visible and d.stability.runtime == "ready"  # verified once, idle now
        env = await host.invoker.invoke(InvokeRequest("echo.say", raw({"text": "wake"})))
        assert env.status == "success"


async def test_probe_failures_replace_a_mute_worker(app):
    cfg = script(
        "mute", ["mute.work"], probe={"intervalMs": 100, "timeoutMs": 100, "failureThreshold": 2}
    )
    cfg["probe"]["startTimeoutMs"] = 5000
    async with running_host(app, {"mute": cfg}) as host:
        # The initial probe goes unanswered too, but only repeated misses while idle kill it.
        await wait_for(
            host, lambda: host.pools["mute"].statistics().last_exit is not None, timeout=10
        )
        ex = host.pools["mute"].statistics().last_exit
        assert ex.reason == "hung" and "2 consecutive probes unanswered" in ex.message


async def test_crash_loop_reaches_failed_and_recovers_when_fixed(app):
    cfg = script(
        "flaky",
        ["flaky.work"],
        restart={"backoffMs": 10, "maxBackoffMs": 400, "intensity": 3, "periodMs": 60_000},
    )
    async with running_host(app, {"flaky": cfg}) as host:
        d = await wait_for(
            host,
            lambda: (
                (d := host.catalog.get("flaky.work")).stability.reasons
                and d.stability.reasons[0].code == "gave-up"
                and d
            ),
        )
        assert d.stability.runtime == "failed" and not d.visible
        assert d.stability.details.restarts == 4  # intensity 3: the 4th failure gives up
        assert "cannot start" in d.stability.details.stderrTail
        env = await host.invoker.invoke(InvokeRequest("flaky.work", raw({})))
        assert env.status == "unavailable"
        (app / "fixed").write_text("yes")  # the operator fixes it; the slow retry picks it up
        await wait_available(host, "flaky.work", timeout=10)
        env = await host.invoker.invoke(InvokeRequest("flaky.work", raw({})))
        assert env.status == "success"
        assert host.pools["flaky"].statistics().gave_up is False


async def test_restart_policy_never(app):
    cfg = script("exit_at_once", ["dead.tool"], restart={"policy": "never"})
    async with running_host(app, {"dead": cfg}) as host:
        await wait_for(
            host,
            lambda: host.catalog.get("dead.tool").stability.details.lastExitCode == 7,
        )
        await wait_for(host, lambda: host.pools["dead"].statistics().places == 0)
        assert host.pools["dead"].statistics().restarts == 0
        assert host.catalog.get("dead.tool").stability.runtime == "failed"


async def test_operator_restart_replaces_workers(app):
    async with running_host(app, {"echo": echo()}) as host:
        await wait_available(host, "echo.say")
        before = host.pools["echo"].workers[0].pid
        assert await host.restart_sidecar("echo") is True
        await wait_available(host, "echo.say")
        env = await host.invoker.invoke(InvokeRequest("echo.say", raw({"text": "x"})))
        assert env.meta.pid != before and msgspec.json.decode(env.data)["pid"] == env.meta.pid
        assert await host.restart_sidecar("nope") is False
