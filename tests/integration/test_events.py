"""``events.subscribe`` (PROTOCOL 6) over the WebSocket gateway of a running host: worker,
call and log events from real sidecar processes, the sidecar filter, bad params, and a
subscriber that stops reading (bounded, then ``events.dropped``)."""

from __future__ import annotations

import os
import signal
from typing import Any

import trio

from supervisor.telemetry.events import QUEUE_LIMIT, EventBus
from tests.conftest import echo, ready_pids, running_host, script, wait_available, wait_for
from tests.kernel import served


async def next_event(peer: Any, pred: Any, timeout: float = 20) -> dict[str, Any]:
    """The first event for which ``pred(event)`` holds (others are skipped)."""
    with trio.fail_after(timeout):
        while True:
            msg = await peer.recv()
            if "event" in msg and pred(msg):
                return msg


async def test_worker_call_and_log_events(app):
    async with (
        running_host(app, {"echo": echo(), "other": script("aecho", ["aecho.say"])}) as host,
        served(host, app) as srv,
        srv.peer("ws-json") as peer,
        srv.peer("ws-json") as filtered,
        srv.peer("ws-json") as caller,
    ):
        await wait_available(host, "echo.say", "aecho.say")
        assert host.invoker.engine.events is None  # nobody watches: the call path is unhooked
        resp = await peer.request(1, "events.subscribe", {"topics": ["workers", "calls", "logs"]})
        assert resp == {"id": 1, "result": {}}
        assert host.invoker.engine.events is host.events
        resp = await filtered.request(1, "events.subscribe", {"topics": ["calls"], "sidecar": "x"})
        assert resp["result"] == {}

        env = await caller.request(7, "tools.invoke", {"tool": "echo.say", "input": {"text": "hi"}})
        assert env["result"]["status"] == "success"
        started = await next_event(peer, lambda m: m["event"] == "call.started")
        assert started["data"]["tool"] == "echo.say" and started["data"]["sidecar"] == "echo"
        assert started["data"]["requestId"] == 7 and "id" not in started
        ended = await next_event(peer, lambda m: m["event"] == "call.ended")
        assert ended["data"]["callId"] == started["data"]["callId"]
        assert ended["data"]["status"] == "success" and ended["data"]["durationMs"] >= 0

        # A crash: the stderr line, the failed call, the worker's exit and its replacement.
        old = ready_pids(host, "echo")[0]
        env = await caller.request(8, "tools.invoke", {"tool": "echo.crash", "input": {}})
        assert env["result"]["error"]["code"] == "worker-crashed"
        line = await next_event(
            peer, lambda m: m["event"] == "log.line" and "about to crash" in m["data"]["line"]
        )
        assert line["data"] == {
            "sidecar": "echo",
            "pid": old,
            "stream": "stderr",
            "line": "about to crash",
        }
        ended = await next_event(
            peer, lambda m: m["event"] == "call.ended" and m["data"]["tool"] == "echo.crash"
        )
        assert ended["data"]["status"] == "failed" and ended["data"]["code"] == "worker-crashed"
        exited = await next_event(
            peer,
            lambda m: m["event"] == "worker.changed" and m["data"]["worker"]["state"] == "exited",
        )
        assert exited["data"]["sidecar"] == "echo" and exited["data"]["worker"]["pid"] == old
        ready = await next_event(
            peer,
            lambda m: m["event"] == "worker.changed" and m["data"]["worker"]["state"] == "ready",
        )
        assert ready["data"]["worker"]["pid"] not in (0, old)

        # SIGKILL from outside: the same story without a call.
        killed = ready["data"]["worker"]["pid"]
        os.kill(killed, signal.SIGKILL)
        exited = await next_event(
            peer,
            lambda m: (
                m["event"] == "worker.changed"
                and m["data"]["worker"] == {**m["data"]["worker"], "pid": killed, "state": "exited"}
            ),
        )
        ready = await next_event(
            peer,
            lambda m: m["event"] == "worker.changed" and m["data"]["worker"]["state"] == "ready",
        )
        assert ready["data"]["worker"]["pid"] not in (0, killed)

        # The filtered subscriber (sidecar "x") heard none of it: its first event is "other"'s.
        await filtered.request(2, "events.subscribe", {"topics": ["calls"], "sidecar": "other"})
        env = await caller.request(9, "tools.invoke", {"tool": "aecho.say", "input": {"text": "o"}})
        assert env["result"]["status"] == "success"
        first = await next_event(filtered, lambda m: True)
        assert first["data"]["sidecar"] == "other", first


async def test_bad_params_are_refused(app):
    async with (
        running_host(app, {"echo": echo()}) as host,
        served(host, app) as srv,
        srv.peer("unix-json") as peer,
    ):
        for rid, params in enumerate(
            [
                {"topics": []},
                {"topics": ["everything"]},
                {},
                {"topics": "calls"},
                {"topics": ["calls"], "x": 1},
            ],
            start=1,
        ):
            resp = await peer.request(rid, "events.subscribe", params)
            assert resp["error"]["code"] == "invalid-params", (params, resp)
        assert host.events.subscribers("calls") == 0
        assert host.invoker.engine.events is None


async def test_a_subscriber_that_stops_reading_loses_events_not_host_memory(app):
    entry = script("stderr_flood", ["flood.echo"])
    async with (
        running_host(app, {"flood": entry}) as host,
        served(host, app) as srv,
        srv.peer("ws-json") as peer,
    ):
        await wait_available(host, "flood.echo")
        resp = await peer.request(1, "events.subscribe", {"topics": ["logs"]})
        assert resp["result"] == {}
        # The test stops reading: the gateway's writer blocks, the session stops moving events,
        # and the subscription fills to its bound and then counts what it drops.
        sub = host.events._subs["logs"][0]
        await wait_for(host, lambda: sub.dropped > 1000 or None, 60, what="drops")
        for _ in range(50):
            assert sub.queued <= QUEUE_LIMIT
            await trio.sleep(0.01)
        # Reading again: how many were lost (told first), then the lines that were kept.
        dropped = await next_event(peer, lambda m: m["event"] == "events.dropped", 60)
        assert dropped["data"]["count"] > 0
        assert host.events.subscribers("logs") == 1  # still subscribed, never disconnected


def test_subscription_bound_and_drop_count():
    bus = EventBus()
    hooked: list[Any] = []
    bus.on_calls = hooked.append
    sub = bus.subscribe(["workers", "calls"], limit=3)
    assert hooked == [bus]
    for i in range(10):
        sub.push("x", i)
    assert sub.queued == 3 and sub.dropped == 7

    async def take() -> list[Any]:
        return await sub.take()

    items = trio.run(take)
    assert items[0][0] == "events.dropped" and items[0][1].count == 7
    assert items[1:] == [("x", 0), ("x", 1), ("x", 2)]
    sub.put_back(items[2:])  # the reader sent the notice and one event, then had to stop
    assert sub.queued == 2 and sub.dropped == 0
    sub.put_back(items[:1])
    assert sub.dropped == 7
    assert trio.run(take)[1:] == [("x", 1), ("x", 2)]
    assert sub.queued == 0 and sub.dropped == 0
    bus.unsubscribe(sub)
    bus.unsubscribe(sub)
    assert hooked == [bus, None] and bus.subscribers("calls") == 0


def test_chain_taps_keeps_an_earlier_tap():
    from supervisor.telemetry.events import chain_taps

    seen: list[tuple[str, bytes]] = []

    def mine(data: bytes) -> None:
        seen.append(("mine", data))

    assert chain_taps(None, mine) is mine
    both = chain_taps(lambda data: seen.append(("theirs", data)), mine)
    both(b"x")
    assert seen == [("theirs", b"x"), ("mine", b"x")]
