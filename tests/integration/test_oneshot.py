"""process-json ``mode: oneshot`` (PROTOCOL 3.2) with a hand-written Flyflor-style script and with
the SDK's utility sidecar: one process per call, deadline kill of the process group, output cap,
concurrency bounded by the pool, ``probe: skipped``."""

import hashlib

import msgspec
import pytest
import trio

from supervisor.calls.call import InvokeRequest
from tests.conftest import pid_alive, raw, running_host, script, wait_available, wait_for

FLY_TOOLS = [
    "fly.echo",
    "fly.fail",
    "fly.garbage",
    "fly.hang",
    "fly.big",
    "fly.slow",
    "fly.flaky",
    "fly.late",
]


def fly(**extra):
    return script("flyflor", FLY_TOOLS, mode="oneshot", **extra)


def scratch(app):
    """A folder the test's scripts write (pid files, counters) and the grant for it: confined,
    a sidecar writes only what its profile grants, as an operator would write it."""
    folder = app / "scratch"
    folder.mkdir()
    return folder, {"write": [str(folder)]}


def decode(env):
    return msgspec.json.decode(env.data)


async def test_success_request_line_and_snapshot(app):
    async with running_host(app, {"fly": fly(config={"region": "eu"})}) as host:
        await wait_available(host, "fly.echo")
        d = host.catalog.get("fly.echo")
        assert d.stability.probe == "skipped" and d.stability.runtime == "ready"
        assert d.protocol == "process-json"
        first = await host.invoker.invoke(InvokeRequest("fly.echo", raw({"text": "héllo"})))
        second = await host.invoker.invoke(InvokeRequest("fly.echo", raw({"text": "again"})))
        assert first.status == "success" and first.content == "echoed"
        data = decode(first)
        assert data["echo"] == {"text": "héllo"}
        req = data["request"]
        assert req["tool"] == "fly.echo" and req["config"] == {"region": "eu"}
        assert req["projectDir"] == str(app / "workspace") and req["cwd"] == str(app)
        assert str(app / ".toolhost") in req["hostPrivate"]  # PROTOCOL 1, host-private
        assert first.meta.pid != second.meta.pid  # one process per call
        assert not pid_alive(first.meta.pid)
        status = next(s for s in host.views.sidecar_statuses() if s.id == "fly")
        assert status.mode == "oneshot" and status.runtime == "ready"


@pytest.mark.parametrize(
    ("code", "status"),
    [
        ("failed", "failed"),
        ("unavailable", "unavailable"),
        ("unsupported", "unavailable"),
        ("invalid-input", "failed"),
        ("weird-code", "failed"),
    ],
)
async def test_ok_false_with_each_code(app, code, status):
    async with running_host(app, {"fly": fly()}) as host:
        await wait_available(host, "fly.fail")
        env = await host.invoker.invoke(
            InvokeRequest("fly.fail", raw({"code": code, "message": f"no: {code}"}))
        )
        assert env.status == status
        assert env.content == f"no: {code}"
        expected = code if code != "weird-code" else "failed"
        assert env.error.code == expected
        assert decode(env) == {"partial": True}  # data survives the failure
        details = env.error.details
        assert details["provider"] == "none"
        if code == "weird-code":
            assert details["sidecarCode"] == "weird-code"
        assert env.error.exitCode == 1 and "refusing on purpose" in env.error.stderr


async def test_non_zero_exit_with_garbage_is_failed_with_stderr(app):
    async with running_host(app, {"fly": fly()}) as host:
        await wait_available(host, "fly.garbage")
        env = await host.invoker.invoke(InvokeRequest("fly.garbage", raw({})))
        assert env.status == "failed" and env.error.code == "failed"
        assert env.error.exitCode == 2
        assert "exit status 2 with no parsable answer" in env.error.message
        assert "this is not json at all" in env.error.message
        assert "something broke" in env.error.stderr
        # The call site is not a crashed worker: the next call runs normally.
        assert (await host.invoker.invoke(InvokeRequest("fly.echo", raw({})))).status == "success"
        assert host.pools["fly"].statistics().restarts == 0


async def test_hang_is_killed_at_the_deadline_with_its_process_group(app):
    folder, grant = scratch(app)
    pidfile = folder / "hang.pids"
    async with running_host(app, {"fly": fly(confine=grant)}) as host:
        await wait_available(host, "fly.hang")
        t0 = trio.current_time()
        env = await host.invoker.invoke(
            InvokeRequest("fly.hang", raw({"pidfile": str(pidfile)}), timeout_ms=3000)
        )
        assert env.status == "failed" and env.error.code == "timeout"
        assert trio.current_time() - t0 < 8
        leader, grandchild = (int(p) for p in pidfile.read_text().split())
        with trio.fail_after(10):
            while pid_alive(leader) or pid_alive(grandchild):
                await trio.sleep(0.05)
        assert (await host.invoker.invoke(InvokeRequest("fly.echo", raw({})))).status == "success"


async def test_cancel_kills_the_process(app):
    folder, grant = scratch(app)
    pidfile = folder / "hang.pids"
    async with running_host(app, {"fly": fly(confine=grant)}) as host:
        await wait_available(host, "fly.hang")
        out = {}

        async def call():
            out["env"] = await host.invoker.invoke(
                InvokeRequest("fly.hang", raw({"pidfile": str(pidfile)}), key=7)
            )

        async with trio.open_nursery() as n:
            n.start_soon(call)
            with trio.fail_after(10):
                while not pidfile.exists() or not pidfile.read_text():
                    await trio.sleep(0.02)
            assert host.invoker.cancel(7)
        assert out["env"].error.code == "cancelled"
        leader, grandchild = (int(p) for p in pidfile.read_text().split())
        # The envelope goes out at once; the process group is killed and reaped right after.
        with trio.fail_after(5):
            while pid_alive(leader) or pid_alive(grandchild):
                await trio.sleep(0.01)
            # The run ends once its process is reaped: a tick or two after the pids are gone.
            while host.pools["fly"].workers[0].inflight:
                await trio.sleep(0.01)


async def test_output_cap(app):
    # The answer line is read up to the output cap (the protocol line limit); the envelope is cut
    # at maxOutputBytes with a visible marker.
    async with running_host(app, {"fly": fly(maxOutputBytes=1000)}) as host:
        await wait_available(host, "fly.big")
        env = await host.invoker.invoke(InvokeRequest("fly.big", raw({"size": 50_000})))
        assert env.status == "success" and env.meta.truncated
        assert "truncated by toolhost" in env.content
        assert len(env.content.encode()) < 1200


async def test_output_over_the_line_cap_kills_the_process(app):
    async with running_host(app, {"fly": fly()}) as host:
        await wait_available(host, "fly.big")
        host.pools["fly"].workers[0].spec.max_line = 10_000
        env = await host.invoker.invoke(InvokeRequest("fly.big", raw({"size": 100_000})))
        assert env.status == "failed" and env.error.code == "output-too-large"
        assert not pid_alive(env.meta.pid)


async def test_answer_then_linger_is_answered_and_reaped(app):
    async with running_host(app, {"fly": fly()}) as host:
        await wait_available(host, "fly.late")
        env = await host.invoker.invoke(InvokeRequest("fly.late", raw({}), timeout_ms=20_000))
        assert env.status == "success" and decode(env) == {"late": True}
        assert env.meta.durationMs < 10_000  # not held until the deadline
        assert not pid_alive(env.meta.pid)


async def test_spawn_concurrency_is_bounded_by_the_pool(app):
    counters, grant = scratch(app)
    async with running_host(app, {"fly": fly(pool={"max": 2, "queue": 8}, confine=grant)}) as host:
        await wait_available(host, "fly.slow")
        envs = []

        async def call():
            envs.append(
                await host.invoker.invoke(
                    InvokeRequest("fly.slow", raw({"dir": str(counters), "seconds": 1.0}))
                )
            )

        async with trio.open_nursery() as n:
            for _ in range(5):
                n.start_soon(call)
            with trio.fail_after(15):
                while host.pools["fly"].queued < 3:
                    await trio.sleep(0.01)  # queueing is not a state change; poll briefly
            assert host.pools["fly"].workers[0].inflight == 2
        assert [e.status for e in envs] == ["success"] * 5
        seen = [decode(e)["concurrent"] for e in envs]
        assert max(seen) <= 2 and 2 in seen


async def test_sdk_sidecar_runs_oneshot(app, project):
    (project / "blob.bin").write_bytes(b"toolhost" * 1000)
    utility = {
        "command": "python",
        "args": ["-m", "sidecars.utility"],
        "mode": "oneshot",
        "tools": ["file.hash", "data.convert"],
    }
    async with running_host(app, {"utility": utility}) as host:
        await wait_available(host, "file.hash")
        env = await host.invoker.invoke(InvokeRequest("file.hash", raw({"path": "blob.bin"})))
        assert env.status == "success", env
        assert decode(env)["digest"] == hashlib.sha256(b"toolhost" * 1000).hexdigest()
        env = await host.invoker.invoke(InvokeRequest("file.hash", raw({"path": "../outside"})))
        assert env.status == "failed" and env.error.code == "invalid-input"
        assert env.error.exitCode == 1
        (project / "reg").symlink_to(app / "tools" / "external.tools.jsonc")
        env = await host.invoker.invoke(InvokeRequest("file.hash", raw({"path": "reg"})))
        assert env.error is not None and env.error.details["reason"] in (
            "host-private",
            "symlink-escape",
        )


async def test_missing_program_is_unavailable_and_restarted_per_policy(app):
    (app / "bin").mkdir()
    tool = app / "bin" / "tool"
    tool.write_text("#!/bin/sh\necho '{\"ok\": true}'\n")
    tool.chmod(0o755)
    entry = {
        "command": "./bin/tool",
        "mode": "oneshot",
        "tools": ["bin.tool"],
        "restart": {"backoffMs": 10, "maxBackoffMs": 50},
    }
    async with running_host(app, {"bin": entry}) as host:
        await wait_available(host, "bin.tool")
        assert (await host.invoker.invoke(InvokeRequest("bin.tool", raw({})))).status == "success"
        tool.unlink()
        env = await host.invoker.invoke(InvokeRequest("bin.tool", raw({})))
        assert env.status == "unavailable" and "cannot execute" in env.error.message
        await wait_for(host, lambda: host.pools["bin"].statistics().restarts >= 1)
        assert host.pools["bin"].statistics().last_exit.reason == "start-failed"
