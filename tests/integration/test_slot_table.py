"""The calls in flight on one worker (``workers/slots.py``), and ``Worker.statistics()`` read off
real workers of every kind."""

from __future__ import annotations

import msgspec
import trio

from supervisor.calls.call import InvokeRequest
from supervisor.protocols.outcome import CallOutcome
from supervisor.workers.slots import SlotTable
from tests.conftest import echo, running_host, script, wait_available, wait_for

OK = CallOutcome(ok=True, data=msgspec.Raw(b"1"))


class FakeCall:
    """What the table touches of a Call: its slot, its end, its progress."""

    def __init__(self, tool: str = "t") -> None:
        self.tool = tool
        self.slot: object = None
        self.ends: list[CallOutcome] = []
        self.progressed: list[bytes] = []

    def ended(self, outcome: CallOutcome) -> None:
        self.ends.append(outcome)

    def progress(self, data: msgspec.Raw) -> None:
        self.progressed.append(bytes(data))


class Pool:
    def __init__(self) -> None:
        self.freed: list[object] = []

    def on_capacity(self, worker: object) -> None:
        self.freed.append(worker)


def table() -> tuple[SlotTable, list[object]]:
    pool = Pool()
    return SlotTable("w", pool), pool.freed


async def test_a_call_ends_once_with_its_answer_and_frees_its_slot():
    slots, freed = table()
    call = FakeCall()
    slot = slots.add(7, call)  # type: ignore[arg-type]
    assert call.slot is slot and slots.started == 1 and len(slots.slots) == 1
    slots.progress(7, msgspec.Raw(b'"half"'))
    slots.answer(7, OK)
    slots.answer(7, OK)  # a second answer (or an unknown id) is ignored
    assert call.ends == [OK] and call.progressed == [b'"half"']
    assert slot.finished and slots.slots == {} and freed == ["w"]


async def test_an_abandoned_call_is_not_ended_by_its_late_answer():
    slots, freed = table()
    call = FakeCall()
    slots.add(1, call)  # type: ignore[arg-type]
    slot = slots.abandon(call)  # type: ignore[arg-type]
    assert slot is not None and slots.abandon(call) is None  # type: ignore[arg-type]
    assert slots.call_on(1) is None and slots.running() == 0 and len(slots.slots) == 1
    slots.progress(1, msgspec.Raw(b"1"))
    slots.answer(1, OK)  # the peer lets go: the slot frees, the call is not ended
    assert call.ends == [] and call.progressed == [] and freed == ["w"]


async def test_release_frees_an_abandoned_slot_at_once():
    slots, freed = table()
    call = FakeCall()
    slots.add(1, call)  # type: ignore[arg-type]
    slot = slots.abandon(call)  # type: ignore[arg-type]
    assert slot is not None
    slots.release(slot)
    assert slots.slots == {} and slot.finished and freed == ["w"] and call.ends == []
    with trio.fail_after(1):
        await slot.wait()
        await slots.drained()


async def test_fail_all_ends_every_live_call_and_wakes_every_waiter():
    slots, _ = table()
    a, b, gone = FakeCall("a"), FakeCall("b"), FakeCall("gone")
    for i, call in enumerate((a, b, gone)):
        slots.add(i, call)  # type: ignore[arg-type]
    slots.abandon(gone)  # type: ignore[arg-type]
    got: list[object] = []

    async def ping() -> None:
        got.append(await slots.wait_for("p1", 10))

    async def drain() -> None:
        await slots.drained()
        got.append("drained")

    with trio.fail_after(2):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(ping)
            nursery.start_soon(drain)
            await trio.sleep(0.01)
            slots.fail_all(
                lambda call: CallOutcome(ok=False, code="worker-crashed", error=call.tool)
            )
    assert [o.error for o in a.ends + b.ends] == ["a", "b"] and gone.ends == []
    assert sorted(map(str, got)) == ["None", "drained"] and slots.slots == {}


async def test_wait_for_gets_the_resolved_value_or_none_after_the_timeout():
    slots, _ = table()
    with trio.fail_after(2):
        async with trio.open_nursery() as nursery:

            async def answer() -> None:
                await trio.sleep(0.01)
                slots.resolve("k", "pong")
                slots.resolve("nobody", "ignored")

            nursery.start_soon(answer)
            assert await slots.wait_for("k", 5) == "pong"
        assert await slots.wait_for("late", 0.01) is None


async def test_when_resolved_calls_back_once_with_the_value_or_none_when_the_worker_ends():
    slots, _ = table()
    got: list[tuple[str, object]] = []
    slots.when_resolved("a", lambda v: got.append(("a", v)))
    slots.when_resolved("b", lambda v: got.append(("b", v)))
    slots.when_resolved("c", lambda v: got.append(("c", v)))
    slots.resolve("a", "pong")
    slots.resolve("a", "again")  # answered already: ignored
    slots.forget("b")  # given up (a timeout, a cancel): its late answer is ignored
    slots.resolve("b", "late")
    assert got == [("a", "pong")]
    slots.fail_all(lambda call: CallOutcome(ok=False, code="worker-crashed"))
    assert got == [("a", "pong"), ("c", None)]
    slots.resolve("c", "after the end")
    assert got == [("a", "pong"), ("c", None)]


async def test_a_receiver_that_raises_is_logged_not_raised_in_the_reader(caplog):
    slots, _ = table()
    got: list[object] = []

    def broken(value: object) -> None:
        raise ValueError("receiver bug")

    slots.when_resolved("a", broken)
    slots.when_resolved("b", got.append)
    slots.when_resolved("c", broken)
    slots.resolve("a", "pong")  # raises nothing
    slots.resolve("b", "pong")
    slots.fail_all(lambda call: CallOutcome(ok=False, code="worker-crashed"))
    assert got == ["pong"]
    assert [r.getMessage() for r in caplog.records] == ["delivering a worker's answer failed"] * 2


async def test_sole_call_is_the_one_live_call():
    slots, _ = table()
    a, b = FakeCall("a"), FakeCall("b")
    assert slots.sole_call() is None
    slots.add(1, a)  # type: ignore[arg-type]
    assert slots.sole_call() is a
    slots.add(2, b)  # type: ignore[arg-type]
    assert slots.sole_call() is None
    slots.answer(2, OK)
    slots.abandon(a)  # type: ignore[arg-type]
    assert slots.sole_call() is None and [s.id for s in slots.live()] == []


async def test_statistics_of_a_persistent_and_a_per_call_worker(app):
    sidecars = {
        "echo": echo(tools=["echo.say"]),
        "fly": script("flyflor", ["fly.echo"], mode="oneshot"),
    }
    async with running_host(app, sidecars) as host:
        await wait_available(host, "echo.say", "fly.echo")
        for sidecar, tool in (("echo", "echo.say"), ("fly", "fly.echo")):
            env = await host.invoker.invoke(InvokeRequest(tool, msgspec.Raw(b'{"text": "hi"}')))
            assert env.status == "success", env
            worker = host.pools[sidecar].workers[0]
            await wait_for(host, lambda w=worker: w.inflight == 0)
            stats = worker.statistics()
            assert stats.sidecar == sidecar and stats.state == "ready"
            assert stats.pid == worker.pid and stats.capacity == worker.concurrency >= 1
            assert stats.calls_started == worker.calls_issued == 1
            assert stats.in_flight == stats.running == 0
            assert stats.ready_at is not None and stats.started_at <= stats.ready_at
            assert stats.last_active >= stats.ready_at
        assert host.pools["fly"].workers[0].statistics().pid is None  # a call site, no process
