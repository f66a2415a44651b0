"""``async def`` tools in the SDK: one Trio loop per sidecar, real cancellation, progress, state
kept across calls, async health checks, oneshot mode, and sync tools next to them unchanged."""

import json
import subprocess
import sys

import msgspec
import trio

from supervisor.calls.call import InvokeRequest
from tests.conftest import FIXTURES, raw, running_host, script, wait_for

AECHO_TOOLS = [
    "aecho.say",
    "aecho.sleep",
    "aecho.add",
    "aecho.fail",
    "aecho.boom",
    "aecho.sync",
    "aecho.block",
]


def aecho(**extra):
    return script("aecho", AECHO_TOOLS, **extra)


def decode(env):
    return msgspec.json.decode(env.data)


async def wait_ready(host):
    await wait_for(
        host, lambda: all(host.catalog.get(t).stability.runtime == "ready" for t in AECHO_TOOLS)
    )


async def test_async_tools_share_one_loop_and_sync_tools_run_in_threads(app):
    async with running_host(app, {"aecho": aecho()}) as host:
        await wait_ready(host)
        first = await host.invoker.invoke(InvokeRequest("aecho.say", raw({"text": "hi"})))
        second = await host.invoker.invoke(InvokeRequest("aecho.say", raw({"text": "again"})))
        assert first.status == "success" and first.content == "hi"
        a, b = decode(first), decode(second)
        assert a["pid"] == b["pid"] and a["token"] == b["token"]
        assert a["main"] is True  # the sidecar's main loop is the Trio loop
        # A sync tool next to them runs in a worker thread, so it cannot block the loop.
        env = await host.invoker.invoke(InvokeRequest("aecho.sync", raw({"text": "plain"})))
        assert env.status == "success" and decode(env) == {"text": "plain", "main": False}


async def test_async_state_survives_across_calls(app):
    async with running_host(app, {"aecho": aecho()}) as host:
        await wait_ready(host)
        totals = []
        for text in ["ab", "cde", "f"]:
            env = await host.invoker.invoke(InvokeRequest("aecho.add", raw({"text": text})))
            assert env.status == "success", env
            totals.append(decode(env)["total"])
        assert totals == [2, 5, 6]


async def test_errors_from_async_code_keep_their_codes(app):
    async with running_host(app, {"aecho": aecho()}) as host:
        await wait_ready(host)
        env = await host.invoker.invoke(InvokeRequest("aecho.fail", raw({})))
        assert env.status == "unavailable" and env.error.code == "unavailable"
        assert env.error.message == "async failure" and env.error.details == {"why": "asked"}
        env = await host.invoker.invoke(InvokeRequest("aecho.boom", raw({})))
        assert env.status == "failed" and env.error.code == "failed"
        assert "ValueError: boom" in env.error.message
        env = await host.invoker.invoke(InvokeRequest("aecho.say", raw({"text": 3})))
        assert env.status == "failed" and env.error.code == "invalid-input"
        # The loop survived all three.
        env = await host.invoker.invoke(InvokeRequest("aecho.say", raw({"text": "alive"})))
        assert env.status == "success"


async def test_progress_from_async_code(app):
    async with running_host(app, {"aecho": aecho()}) as host:
        await wait_ready(host)
        seen = []
        env = await host.invoker.invoke(
            InvokeRequest("aecho.sleep", raw({"seconds": 0.03, "steps": 3})),
            on_progress=lambda d: seen.append(msgspec.json.decode(d)),
        )
        assert env.status == "success" and decode(env) == {"slept": 0.03}
        assert seen == [{"step": 1, "of": 3}, {"step": 2, "of": 3}, {"step": 3, "of": 3}]


async def test_cancel_is_a_real_trio_cancellation(app, tmp_path):
    marks = tmp_path / "marks"  # the tool writes its marker there: granted, as it must be
    marks.mkdir()
    marker = marks / "cancelled.txt"
    async with running_host(app, {"aecho": aecho(confine={"write": [str(marks)]})}) as host:
        await wait_ready(host)
        pid = host.pools["aecho"].workers[0].pid
        out = {}
        started = trio.Event()

        async def call():
            out["env"] = await host.invoker.invoke(
                InvokeRequest(
                    "aecho.sleep", raw({"seconds": 30, "steps": 3, "marker": str(marker)}), key="k"
                ),
                on_progress=lambda _: started.set(),
            )

        async with trio.open_nursery() as n:
            n.start_soon(call)
            with trio.fail_after(10):
                await started.wait()
            assert host.invoker.cancel("k") is True
        assert out["env"].status == "failed" and out["env"].error.code == "cancelled"
        # The tool itself saw trio.Cancelled (the 10 s sleep was interrupted, not finished).
        with trio.fail_after(10):
            while not marker.exists():
                await trio.sleep(0.01)
        assert marker.read_text() == "cancelled"
        # Same worker, still serving async and sync calls.
        env = await host.invoker.invoke(InvokeRequest("aecho.say", raw({"text": "after"})))
        assert env.status == "success" and env.meta.pid == pid
        assert (
            await host.invoker.invoke(InvokeRequest("aecho.sync", raw({"text": "x"})))
        ).status == "success"


async def test_blocking_sync_tool_does_not_stall_async_ones_and_cancels(app):
    async with running_host(app, {"aecho": aecho()}) as host:
        await wait_ready(host)
        out = {}

        async def blocked():
            out["env"] = await host.invoker.invoke(InvokeRequest("aecho.block", raw({}), key="b"))

        async with trio.open_nursery() as n:
            n.start_soon(blocked)
            # The loop keeps serving async calls while a thread is stuck in the sync tool.
            for _ in range(5):
                env = await host.invoker.invoke(
                    InvokeRequest("aecho.say", raw({"text": "meanwhile"}))
                )
                assert env.status == "success"
            await wait_for(host, lambda: host.invoker.cancel("b"))
        assert out["env"].status == "failed" and out["env"].error.code == "cancelled"
        assert (
            await host.invoker.invoke(InvokeRequest("aecho.sync", raw({"text": "x"})))
        ).status == "success"


async def test_deadline_cancels_the_async_call_and_worker_keeps_serving(app):
    async with running_host(app, {"aecho": aecho()}) as host:
        await wait_ready(host)
        pid = host.pools["aecho"].workers[0].pid
        env = await host.invoker.invoke(
            InvokeRequest("aecho.sleep", raw({"seconds": 30}), timeout_ms=200)
        )
        assert env.status == "failed" and env.error.code == "timeout"
        env = await host.invoker.invoke(InvokeRequest("aecho.say", raw({"text": "still"})))
        assert env.status == "success" and env.meta.pid == pid
        assert host.pools["aecho"].statistics().restarts == 0


async def test_async_health_check_drives_the_probe(app):
    probe = {"intervalMs": 50, "timeoutMs": 1000, "failureThreshold": 1}
    async with running_host(app, {"aecho": aecho(probe=probe)}, host={"projectDir": "."}) as host:
        await wait_ready(host)
        await wait_for(host, lambda: host.catalog.get("aecho.say").stability.probe == "healthy")
        (app / "aecho-down").write_text("1")
        await wait_for(host, lambda: host.catalog.get("aecho.say").stability.probe == "unavailable")
        assert host.catalog.get("aecho.sleep").stability.probe == "healthy"
        (app / "aecho-down").unlink()
        await wait_for(
            host, lambda: host.catalog.get("aecho.say").stability.effective == "available"
        )


def test_async_tool_in_oneshot_mode(tmp_path):
    def oneshot(tool, payload):
        line = json.dumps({"tool": tool, "input": payload, "projectDir": str(tmp_path)})
        return subprocess.run(
            [sys.executable, str(FIXTURES / "aecho.py")],
            input=line + "\n",
            capture_output=True,
            text=True,
            timeout=30,
        )

    proc = oneshot("aecho.add", {"text": "abcd"})
    assert proc.returncode == 0, proc.stderr
    answer = json.loads(proc.stdout.splitlines()[0])
    assert answer["ok"] is True and answer["total"] == 4 and answer["main"] is True
    proc = oneshot("aecho.fail", {})
    assert proc.returncode == 1
    answer = json.loads(proc.stdout.splitlines()[0])
    assert answer == {"why": "asked", "ok": False, "code": "unavailable", "error": "async failure"}
