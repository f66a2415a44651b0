"""The one call path of tools.invoke over the socket (no task per call): deadlines from the
queue and on the worker, cancel, disconnect, crashes, and calls queued behind a busy worker."""

import json

import msgspec
import trio

from tests.conftest import (
    echo,
    read_only_manifests,
    running_host,
    script,
    wait_available,
    wait_for,
)
from tests.kernel import UnixPeer, served, unix_peer


def invoke(rid, tool, inp, **params):
    return {"id": rid, "method": "tools.invoke", "params": {"tool": tool, "input": inp, **params}}


async def test_deadline_expires_from_the_queue_and_the_worker_survives(app):
    async with running_host(app, {"echo": echo(tools=["echo.sleep", "echo.say"])}) as host:
        await wait_available(host, "echo.sleep")
        pid = host.pools["echo"].workers[0].pid
        async with served(host, app) as srv, unix_peer(srv.sock) as peer:
            t0 = trio.current_time()
            resp = await peer.request(
                1,
                "tools.invoke",
                {"tool": "echo.sleep", "input": {"seconds": 5, "steps": 100}, "timeoutMs": 200},
            )
            assert (
                resp["result"]["status"] == "failed"
                and resp["result"]["error"]["code"] == "timeout"
            )
            assert trio.current_time() - t0 < 3
            assert host.invoker.engine.calls == {}
            resp = await peer.request(
                2, "tools.invoke", {"tool": "echo.say", "input": {"text": "after"}}
            )
            assert resp["result"]["meta"]["pid"] == pid  # the SDK answered the cancel: no kill
        assert host.pools["echo"].statistics().restarts == 0


async def test_hung_worker_is_killed_after_the_grace(app):
    async with running_host(app, {"hang": script("hang", ["hang.forever", "hang.ok"])}) as host:
        await wait_available(host, "hang.ok")
        async with served(host, app) as srv, unix_peer(srv.sock) as peer:
            resp = await peer.request(
                1, "tools.invoke", {"tool": "hang.forever", "input": {}, "timeoutMs": 200}
            )
            assert resp["result"]["error"]["code"] == "timeout"
            await wait_for(host, lambda: host.pools["hang"].statistics().last_exit is not None)
            assert host.pools["hang"].statistics().last_exit.reason == "hung"


async def test_cancel_a_direct_call(app):
    async with running_host(app, {"echo": echo(tools=["echo.sleep"])}) as host:
        await wait_available(host, "echo.sleep")
        async with served(host, app) as srv, unix_peer(srv.sock) as peer:
            await peer.send(invoke(1, "echo.sleep", {"seconds": 20, "steps": 400}))
            with trio.fail_after(10):
                while not host.invoker.engine.calls:
                    await trio.sleep(0.005)
            await peer.send({"id": 2, "method": "tools.cancel", "params": {"id": 1}})
            got = {}
            while len(got) < 2:
                msg = await peer.recv()
                got[msg["id"]] = msg["result"]
            assert got[2] == {"cancelled": True}
            assert got[1]["status"] == "failed" and got[1]["error"]["code"] == "cancelled"
            # The sidecar was told: the worker has nothing in flight once it answers the cancel.
            with trio.fail_after(10):
                while host.pools["echo"].workers[0].inflight:
                    await trio.sleep(0.01)


async def test_disconnect_cancels_read_only_direct_calls_and_audits_them(app):
    manifests = read_only_manifests(app, ["echo.sleep"])
    reg = {"echo": echo(tools=["echo.sleep"])}
    async with running_host(app, reg, manifest_dirs=manifests) as host:
        await wait_available(host, "echo.sleep")
        async with served(host, app) as srv:
            stream = await trio.open_unix_socket(str(srv.sock))
            peer = UnixPeer(stream)
            await peer.send(invoke(1, "echo.sleep", {"seconds": 30, "steps": 600}))
            with trio.fail_after(10):
                while not host.invoker.engine.calls:
                    await trio.sleep(0.005)
            await stream.aclose()
            with trio.fail_after(10):
                while host.pools["echo"].workers[0].inflight or host.invoker.engine.calls:
                    await trio.sleep(0.01)
        host.audit.flush()
        lines = [
            json.loads(x) for x in (app / ".toolhost" / "audit.jsonl").read_text().splitlines()
        ]
        assert lines[-1]["tool"] == "echo.sleep" and lines[-1]["errorCode"] == "cancelled"


async def test_worker_crash_fails_the_direct_call_at_once(app):
    async with running_host(app, {"echo": echo(tools=["echo.crash"])}) as host:
        await wait_available(host, "echo.crash")
        async with served(host, app) as srv, unix_peer(srv.sock) as peer:
            resp = await peer.request(1, "tools.invoke", {"tool": "echo.crash", "input": {}})
            env = resp["result"]
            assert env["status"] == "failed" and env["error"]["code"] == "worker-crashed"
            assert env["error"]["exitCode"] == 3


async def test_busy_worker_hands_over_to_the_awaiting_gear(app):
    cfg = echo(tools=["echo.sleep"], env={"ECHO_CONCURRENCY": "1"}, pool={"min": 1, "max": 1})
    async with running_host(app, {"echo": cfg}) as host:
        await wait_available(host, "echo.sleep")
        async with served(host, app) as srv, unix_peer(srv.sock) as peer:
            body = b"".join(
                msgspec.json.encode(invoke(i, "echo.sleep", {"seconds": 0.05})) + b"\n"
                for i in range(1, 5)
            )
            await peer.send_bytes(body)  # one write: the first goes direct, the rest must queue
            got = {}
            with trio.fail_after(20):
                while len(got) < 4:
                    msg = await peer.recv()
                    got[msg["id"]] = msg["result"]
            assert all(got[i]["status"] == "success" for i in range(1, 5))
        assert host.pools["echo"].dispatch.starts == 4


async def test_direct_refusals_are_answered_and_audited(app):
    async with running_host(
        app, {"echo": echo(tools=["echo.say"], sandbox={"echo.say": "approval-required"})}
    ) as host:
        await wait_available(host, "echo.say")
        async with served(host, app) as srv, unix_peer(srv.sock) as peer:
            resp = await peer.request(
                1, "tools.invoke", {"tool": "echo.say", "input": {"text": "x"}}
            )
            assert resp["result"]["error"]["code"] == "approval-required"
            resp = await peer.request(
                2,
                "tools.invoke",
                {
                    "tool": "echo.say",
                    "input": {"text": "x"},
                    "approval": {"granted": True, "by": "op"},
                },
            )
            assert resp["result"]["status"] == "success"
        host.audit.flush()
        lines = [
            json.loads(x) for x in (app / ".toolhost" / "audit.jsonl").read_text().splitlines()
        ]
        assert [x.get("errorCode") for x in lines] == [
            "approval-required",
            None,
        ]
        assert lines[1]["approval"] == {"granted": True, "by": "op"}
