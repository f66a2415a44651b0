"""Misbehaving sidecars: the caller gets a structured result, the snapshot tells the truth, the
worker is replaced per policy, and a healthy sidecar next to it keeps serving throughout."""

import msgspec
import trio

from supervisor.calls.call import InvokeRequest
from tests.conftest import (
    bystander,
    echo,
    effective,
    raw,
    running_host,
    script,
    wait_available,
    wait_for,
    wait_replaced,
)


def pool(host, sid):
    return host.pools[sid]


async def test_crash_mid_call(app):
    async with running_host(
        app, {"good": echo(tools=["echo.say"]), "bad": script("echo", ["echo.crash"])}
    ) as host:
        await wait_available(host, "echo.say", "echo.crash")
        async with bystander(host):
            first = pool(host, "bad").workers[0].pid
            env = await host.invoker.invoke(InvokeRequest("echo.crash", raw({})))
            assert env.status == "failed" and env.error.code == "worker-crashed"
            assert env.error.exitCode == 3
            assert "about to crash" in env.error.stderr  # stray stdout went to stderr
            assert env.meta.pid == first
            await wait_for(host, lambda: pool(host, "bad").statistics().restarts == 1)
            assert effective(host, "echo.crash") == "available"  # the restart window
            await wait_replaced(host, "bad", first)
        d = host.catalog.get("echo.crash")
        assert d.stability.details.restarts == 1 and d.stability.details.lastExitCode == 3


async def test_hang_is_killed_at_deadline_and_replaced(app):
    sidecars = {
        "good": echo(tools=["echo.say"]),
        "hang": script("hang", ["hang.forever", "hang.ok"]),
    }
    async with running_host(app, sidecars) as host:
        await wait_available(host, "echo.say", "hang.ok")
        async with bystander(host):
            first = pool(host, "hang").workers[0].pid
            t0 = trio.current_time()
            env = await host.invoker.invoke(InvokeRequest("hang.forever", raw({}), timeout_ms=300))
            assert env.status == "failed" and env.error.code == "timeout"
            assert trio.current_time() - t0 < 2.0  # answered at the deadline, not after the kill
            await wait_for(host, lambda: pool(host, "hang").statistics().last_exit is not None)
            assert pool(host, "hang").statistics().last_exit.reason == "hung"
            assert (
                "did not stop within 300 ms of cancel"
                in pool(host, "hang").statistics().last_exit.message
            )
            await wait_available(host, "hang.ok")
            env = await host.invoker.invoke(InvokeRequest("hang.ok", raw({})))
            assert env.status == "success" and env.meta.pid != first


async def test_garbage_on_stdout_is_a_protocol_error(app):
    sidecars = {
        "good": echo(tools=["echo.say"]),
        "junk": script("garbage", ["garbage.print", "garbage.ok"]),
    }
    async with running_host(app, sidecars) as host:
        await wait_available(host, "echo.say", "garbage.ok")
        async with bystander(host):
            env = await host.invoker.invoke(InvokeRequest("garbage.print", raw({})))
            assert env.status == "failed" and env.error.code == "protocol-error"
            assert "Loading model" in env.error.message
            await wait_for(host, lambda: pool(host, "junk").statistics().last_exit is not None)
            assert pool(host, "junk").statistics().last_exit.reason == "protocol-error"
            await wait_available(host, "garbage.ok")
            assert (
                host.catalog.get("garbage.ok").stability.details.lastExitReason == "protocol-error"
            )


async def test_never_ready_times_out(app):
    sidecars = {
        "good": echo(tools=["echo.say"]),
        # long enough for its stderr line to be written first: a confined exec'd start runs
        # the exec shim's interpreter before the fixture's (TOOLHOST_SPAWN=exec, loaded CI)
        "slow": script("never_ready", ["slow.tool"], probe={"startTimeoutMs": 1500}),
    }
    async with running_host(app, sidecars) as host:
        await wait_available(host, "echo.say")
        async with bystander(host):
            d = await wait_for(
                host,
                lambda: (
                    (d := host.catalog.get("slow.tool"))
                    and d.stability.runtime == "timed-out"
                    and d
                ),
            )
            assert d.stability.effective == "unavailable" and not d.visible
            reason = d.stability.reasons[0]
            assert reason.field == "runtime" and reason.code == "start-timeout"
            assert "startTimeoutMs" in reason.hint
            assert "starting up, very slowly" in d.stability.details.stderrTail
            env = await host.invoker.invoke(InvokeRequest("slow.tool", raw({})))
            assert env.status == "unavailable" and env.error.code == "not-visible"


async def test_exit_at_once_fails_fast_with_stderr_and_gives_up(app):
    sidecars = {
        "good": echo(tools=["echo.say"]),
        "dead": script(
            "exit_at_once",
            ["dead.tool"],
            restart={"backoffMs": 10, "maxBackoffMs": 60_000, "intensity": 3, "periodMs": 60_000},
        ),
    }
    async with running_host(app, sidecars) as host:
        await wait_available(host, "echo.say")
        async with bystander(host):
            d = await wait_for(
                host,
                lambda: (
                    (d := host.catalog.get("dead.tool"))
                    and d.stability.reasons
                    and d.stability.reasons[0].code == "gave-up"
                    and d
                ),
            )
        st = d.stability
        assert st.runtime == "failed" and st.effective == "unavailable"
        assert st.details.lastExitCode == 7 and st.details.restarts == 4
        assert "fatal: missing configuration" in st.details.stderrTail
        assert "exited before ready (exit status 7)" in st.reasons[0].message
        status = next(s for s in host.views.sidecar_statuses() if s.id == "dead")
        assert status.runtime == "backoff" and status.nextRestartMs > 1000  # retried only slowly


async def test_stderr_flood_never_stalls(app):
    sidecars = {"good": echo(tools=["echo.say"]), "flood": script("stderr_flood", ["flood.echo"])}
    async with running_host(app, sidecars) as host:
        await wait_available(host, "echo.say", "flood.echo")
        async with bystander(host):
            for i in range(30):
                env = await host.invoker.invoke(InvokeRequest("flood.echo", raw({"i": i})))
                assert env.status == "success" and msgspec.json.decode(env.data) == {
                    "echo": {"i": i}
                }
        w = pool(host, "flood").workers[0]
        assert w.stderr.total > 1_000_000  # megabytes were drained...
        assert len(w.stderr.tail(1 << 20).encode()) <= 64 * 1024  # ...into a bounded ring
        assert "noise" in host.pools["flood"].stderr_tail()


async def test_wrong_id_fails_the_call_at_once(app):
    sidecars = {"good": echo(tools=["echo.say"]), "wrong": script("wrong_id", ["wrong.id"])}
    async with running_host(app, sidecars) as host:
        await wait_available(host, "echo.say", "wrong.id")
        async with bystander(host):
            t0 = trio.current_time()
            env = await host.invoker.invoke(InvokeRequest("wrong.id", raw({}), timeout_ms=10_000))
            assert env.status == "failed" and env.error.code == "protocol-error"
            assert "answer for unknown call 1001" in env.error.message
            assert trio.current_time() - t0 < 5  # not at the deadline
            await wait_for(host, lambda: pool(host, "wrong").statistics().restarts >= 1)


async def test_second_answer_recycles_the_worker(app):
    sidecars = {"good": echo(tools=["echo.say"]), "twice": script("twice", ["twice.answer"])}
    async with running_host(app, sidecars) as host:
        await wait_available(host, "echo.say", "twice.answer")
        async with bystander(host):
            env = await host.invoker.invoke(InvokeRequest("twice.answer", raw({})))
            assert env.status == "success" and msgspec.json.decode(env.data) == {"n": 1}
            await wait_for(host, lambda: pool(host, "twice").statistics().last_exit is not None)
            assert "second answer for call 1" in pool(host, "twice").statistics().last_exit.message
            await wait_available(host, "twice.answer")
        assert effective(host, "twice.answer") == "available"
