"""MCP stdio servers as sidecars, with a server written with the official ``mcp`` SDK: tools from
tools/list, isError, progress, cancellation on tools.cancel and on deadline, tools/list_changed,
a stderr flood, a crash mid-call, pooled servers, retry."""

import msgspec
import trio

from supervisor.calls.call import InvokeRequest
from tests.conftest import FIXTURES, raw, running_host, wait_available, wait_for

SERVER = FIXTURES.parent / "mcp" / "server.py"


def fixture_server(**extra):
    entry = {
        "command": "python",
        "args": [str(SERVER)],
        "protocol": "mcp",
        "restart": {"backoffMs": 20, "maxBackoffMs": 200},
        "probe": {"startTimeoutMs": 20_000},
    }
    entry.update(extra)
    return entry


def decode(env):
    return msgspec.json.decode(env.data)


async def stderr_says(pool, text, timeout=15):
    """Wait until the server's stderr shows ``text`` (stderr is not a state change: poll)."""
    with trio.fail_after(timeout):
        while text not in pool.stderr_tail():
            await trio.sleep(0.02)


async def whoami(host):
    env = await host.invoker.invoke(InvokeRequest("whoami", raw({})))
    assert env.status == "success", env
    return decode(env)["pid"]


async def test_tools_from_tools_list_and_calls(app):
    async with running_host(app, {"fx": fixture_server()}) as host:
        await wait_available(host, "slow", "explode", "whoami")
        d = host.catalog.get("slow")
        assert d.sidecar == "fx" and d.protocol == "mcp"
        assert d.description.startswith("Sleep for")
        assert d.inputSchema["required"] == ["seconds"]
        assert d.stability.probe == "healthy" and d.stability.runtime == "ready"
        # No manifest: the server's readOnlyHint decides (absent means state-changing).
        assert host.catalog.get("whoami").annotations.readOnly and not d.annotations.readOnly
        status = next(s for s in host.views.sidecar_statuses() if s.id == "fx")
        assert {"slow", "explode", "whoami", "grow"} <= set(status.tools)
        pid = await whoami(host)
        assert pid == host.pools["fx"].workers[0].pid
        # No structuredContent: the content blocks are the data, their text the model's text.
        env = await host.invoker.invoke(InvokeRequest("slow", raw({"seconds": 0.01})))
        assert env.status == "success"
        (block,) = decode(env)
        assert block["type"] == "text" and msgspec.json.decode(block["text"]) == {"slept": 0.01}
        assert msgspec.json.decode(env.content) == {"slept": 0.01}


async def test_is_error_is_failed(app):
    async with running_host(app, {"fx": fixture_server()}) as host:
        await wait_available(host, "explode")
        env = await host.invoker.invoke(
            InvokeRequest("explode", raw({"message": "the flux capacitor"}))
        )
        assert env.status == "failed" and env.error.code == "failed"
        assert "the flux capacitor" in env.content
        assert "flux capacitor" in decode(env)[0]["text"]  # the content blocks are kept
        env = await host.invoker.invoke(InvokeRequest("slow", raw({"seconds": "soon"})))
        assert env.status == "failed"  # argument validation is an isError result too


async def test_progress_notifications_become_progress_events(app):
    async with running_host(app, {"fx": fixture_server()}) as host:
        await wait_available(host, "slow")
        seen = []
        env = await host.invoker.invoke(
            InvokeRequest("slow", raw({"seconds": 0.15, "steps": 3})),
            on_progress=lambda data: seen.append(msgspec.json.decode(data)),
        )
        assert env.status == "success"
        assert seen == [{"progress": i, "total": 3, "message": f"step {i} of 3"} for i in (1, 2, 3)]


async def test_tools_cancel_sends_notifications_cancelled(app):
    async with running_host(app, {"fx": fixture_server()}) as host:
        await wait_available(host, "slow")
        pid = await whoami(host)
        started = trio.Event()
        out = {}

        async def call():
            out["env"] = await host.invoker.invoke(
                InvokeRequest("slow", raw({"seconds": 30, "steps": 30}), key="c1"),
                on_progress=lambda _: started.set(),
            )

        async with trio.open_nursery() as n:
            n.start_soon(call)
            with trio.fail_after(15):
                await started.wait()
            assert host.invoker.cancel("c1")
        assert out["env"].status == "failed" and out["env"].error.code == "cancelled"
        pool = host.pools["fx"]
        await stderr_says(pool, "slow(30.0) was cancelled")
        assert pool.workers[0].inflight == 0
        assert await whoami(host) == pid  # the server is not replaced


async def test_deadline_cancels_and_keeps_the_server(app):
    async with running_host(app, {"fx": fixture_server()}) as host:
        await wait_available(host, "slow")
        pid = await whoami(host)
        env = await host.invoker.invoke(
            InvokeRequest("slow", raw({"seconds": 30, "steps": 30}), timeout_ms=1500)
        )
        assert env.status == "failed" and env.error.code == "timeout"
        pool = host.pools["fx"]
        await stderr_says(pool, "slow(30.0) was cancelled")
        assert await whoami(host) == pid and pool.statistics().restarts == 0


async def test_tools_list_changed_refreshes_the_catalog(app):
    async with running_host(app, {"fx": fixture_server()}) as host:
        await wait_available(host, "grow")
        events = host.feed.subscribe()
        env = await host.invoker.invoke(InvokeRequest("grow", raw({"name": "late_tool"})))
        assert env.status == "success"
        d = await wait_for(host, lambda: host.catalog.get("late_tool"))
        assert d.description == "added at run time as late_tool" and d.visible
        changed = events.receive_nowait()
        assert any(t.name == "late_tool" for t in changed.tools)
        env = await host.invoker.invoke(InvokeRequest("late_tool", raw({})))
        assert env.status == "success" and env.content == "late_tool says hi"
        revision = host.catalog.revision
        assert (
            await host.invoker.invoke(InvokeRequest("shrink", raw({"name": "late_tool"})))
        ).status == "success"
        await wait_for(host, lambda: host.catalog.get("late_tool") is None)
        assert host.catalog.revision > revision
        env = await host.invoker.invoke(InvokeRequest("late_tool", raw({})))
        assert env.status == "unavailable" and env.error.code == "unknown-tool"


async def test_stderr_flood_never_stalls(app):
    async with running_host(app, {"fx": fixture_server()}) as host:
        await wait_available(host, "noisy", "whoami")
        results = []

        async def noisy():
            results.append(await host.invoker.invoke(InvokeRequest("noisy", raw({"kb": 2048}))))

        async with trio.open_nursery() as n:
            n.start_soon(noisy)
            n.start_soon(noisy)
            for _ in range(5):
                await whoami(host)
        assert [r.status for r in results] == ["success", "success"]
        w = host.pools["fx"].workers[0]
        assert w.stderr.total > 4_000_000
        assert len(w.stderr.tail(1 << 20).encode()) <= 64 * 1024


async def test_server_dying_mid_call_fails_at_once_and_is_restarted(app):
    async with running_host(app, {"fx": fixture_server()}) as host:
        await wait_available(host, "die", "whoami")
        first = await whoami(host)
        t0 = trio.current_time()
        env = await host.invoker.invoke(InvokeRequest("die", raw({}), timeout_ms=20_000))
        assert env.status == "failed" and env.error.code == "worker-crashed"
        assert trio.current_time() - t0 < 10  # not at the deadline
        assert env.error.exitCode == 5 and "dying mid-call" in env.error.stderr
        await wait_for(host, lambda: host.pools["fx"].statistics().restarts == 1)
        await wait_available(host, "whoami")
        assert await whoami(host) != first
        d = host.catalog.get("whoami")
        assert d.stability.details.restarts == 1 and d.stability.details.lastExitCode == 5


async def test_mcp_servers_are_pooled(app):
    async with running_host(app, {"fx": fixture_server(pool={"min": 2, "max": 2})}) as host:
        await wait_for(host, lambda: sum(w.state == "ready" for w in host.pools["fx"].workers) == 2)
        pids = set()

        async def call():
            env = await host.invoker.invoke(InvokeRequest("slow", raw({"seconds": 0.5})))
            assert env.status == "success"
            pids.add(env.meta.pid)

        async with trio.open_nursery() as n:
            for _ in range(4):
                n.start_soon(call)
        assert len(pids) == 2


async def test_read_only_retry_and_timeout_from_the_manifest(app):
    folder = app / "m"
    folder.mkdir()
    (folder / "fx.toml").write_text(
        """
[[tool]]
name = "die"
readOnly = true
retry = { maxAttempts = 2, backoffMs = 10 }

[[tool]]
name = "slow"
timeoutMs = 300
inputSchema = { type = "object", properties = { seconds = { type = "number" } } }
"""
    )
    async with running_host(app, {"fx": fixture_server()}, manifest_dirs=[str(folder)]) as host:
        await wait_available(host, "die", "slow")
        env = await host.invoker.invoke(InvokeRequest("die", raw({})))
        assert env.error.code == "worker-crashed" and env.meta.attempts == 2
        await wait_available(host, "slow")
        env = await host.invoker.invoke(InvokeRequest("slow", raw({"seconds": 30})))
        assert env.error.code == "timeout" and "300 ms" in env.error.message
        assert host.catalog.get("slow").inputSchema["properties"] == {"seconds": {"type": "number"}}


async def test_a_server_that_cannot_start_is_failed_with_its_stderr(app):
    entry = fixture_server(
        args=["-c", "import sys; print('no API key configured', file=sys.stderr); sys.exit(4)"],
        tools=["remote.search"],
        restart={"backoffMs": 10, "maxBackoffMs": 60_000, "intensity": 2, "periodMs": 60_000},
    )
    async with running_host(app, {"broken": entry}) as host:
        d = await wait_for(
            host,
            lambda: (
                (d := host.catalog.get("remote.search")).stability.reasons
                and d.stability.reasons[0].code == "gave-up"
                and d
            ),
        )
        assert d.protocol == "mcp" and not d.visible
        assert "no API key configured" in d.stability.details.stderrTail
        assert d.stability.details.lastExitCode == 4


async def test_junk_on_stdout_is_a_protocol_error(app):
    entry = fixture_server(
        args=[
            "-c",
            "import sys, time; print('Starting server...'); sys.stdout.flush(); time.sleep(30)",
        ],
        tools=["x.y"],
        restart={"policy": "never"},
    )
    async with running_host(app, {"junk": entry}) as host:
        d = await wait_for(
            host, lambda: (d := host.catalog.get("x.y")).stability.runtime == "schema-error" and d
        )
        assert "Starting server" in d.stability.reasons[0].message
        assert host.pools["junk"].statistics().last_exit.reason == "protocol-error"
        assert host.pools["junk"].workers == []  # killed, reaped, not restarted (policy never)
