"""The call state machine (queued -> running -> backoff -> done), driven on a fake clock with a
fake worker: every transition ends in exactly one envelope and one quota release."""

from __future__ import annotations

import msgspec
import pytest

from supervisor.calls.call import Call, CallEngine, CallOutcome, Dispatch, InvokeRequest
from supervisor.calls.timers import Timers
from supervisor.contracts.manifest import RetryConfig, ToolManifest

OK = CallOutcome(ok=True, data=msgspec.Raw(b'{"n":1}'), pid=100)
CRASH = CallOutcome(ok=False, code="worker-crashed", error="worker died", pid=100)
RETRY = ToolManifest(name="t", read_only=True, retry=RetryConfig(max_attempts=3, backoff_ms=100))


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class FakeWorker:
    """Runs nothing: the test decides when each call it holds ends."""

    def __init__(self, dispatch: Dispatch, concurrency: int = 1, answer_at_once=None) -> None:
        self.dispatch = dispatch
        self.state = "ready"
        self.concurrency = concurrency
        self.pid = 100
        self.running: list[Call] = []
        self.abandoned: list[Call] = []
        self.answer_at_once = answer_at_once

    @property
    def inflight(self) -> int:
        return len(self.running)

    def start(self, call: Call) -> None:
        if self.answer_at_once is not None:
            call.ended(self.answer_at_once)
            return
        self.running.append(call)
        call.slot = call

    def abandon(self, call: Call) -> None:
        self.abandoned.append(call)
        self.running.remove(call)
        self.dispatch.pump()

    def answer(self, call: Call, outcome: CallOutcome) -> None:
        self.running.remove(call)
        call.ended(outcome)
        self.dispatch.pump()

    def die(self, outcome: CallOutcome = CRASH) -> None:
        self.state = "exited"
        calls, self.running = self.running, []
        for call in calls:
            call.ended(outcome)


class Rig:
    """A pool's dispatch, the engine and the timers on a fake clock, recording every end."""

    def __init__(self, *, workers: int = 1, queue: int = 8, answer_at_once=None) -> None:
        self.clock = Clock()
        self.timers = Timers()
        self.released: list[tuple[str, ...]] = []
        self.recorded: list[tuple[Call, object]] = []
        self.refusal: CallOutcome | None = None
        self.workers: list[FakeWorker] = []
        self.dispatch = Dispatch(
            "side", queue, self.workers, refusal=lambda: self.refusal, on_queued=lambda: None
        )
        for _ in range(workers):
            self.workers.append(FakeWorker(self.dispatch, answer_at_once=answer_at_once))
        self.engine = CallEngine(
            self.clock,
            self.timers,
            release=self.released.append,
            record=lambda call, env: self.recorded.append((call, env)),
        )
        self.envelopes: dict[str, list] = {}

    def call(self, name: str, *, timeout_ms: int = 1000, manifest=None, key=None) -> Call:
        self.envelopes[name] = []
        call = Call(
            self.engine,
            self.dispatch,
            InvokeRequest("t", msgspec.Raw(b"{}"), key=key if key is not None else name),
            self.envelopes[name].append,
            t0=self.clock.now,
            timeout_ms=timeout_ms,
            manifest=manifest,
            max_output=65536,
            ticket=(name,),
        )
        self.engine.begin(call)
        return call

    def advance(self, seconds: float) -> None:
        self.clock.now += seconds
        self.timers.fire(self.clock.now)

    def one(self, name: str):
        """The call's one envelope; its quota was released exactly once."""
        envs = self.envelopes[name]
        assert len(envs) == 1, f"{name}: {len(envs)} envelopes"
        assert self.released.count((name,)) == 1
        return envs[0]

    def settled(self) -> None:
        """Nothing is left behind: no live timer, no keyed call, no queued call."""
        assert len(self.timers) == 0
        assert self.engine.calls == {} and self.engine.backoff == set()
        assert self.dispatch.queued == 0


def test_runs_at_once_and_answers():
    rig = Rig()
    a = rig.call("a")
    assert a.state == "running" and rig.workers[0].running == [a]
    rig.workers[0].answer(a, OK)
    env = rig.one("a")
    assert env.status == "success" and env.meta.attempts == 1 and env.meta.pid == 100
    rig.settled()


def test_answer_inside_start_is_one_envelope():
    rig = Rig(answer_at_once=OK)
    rig.call("a")
    assert rig.one("a").status == "success"
    rig.settled()


def test_queued_call_runs_on_the_tick_a_slot_frees():
    rig = Rig()
    a, b = rig.call("a"), rig.call("b")
    assert b.state == "queued" and rig.dispatch.queued == 1
    rig.workers[0].answer(a, OK)
    assert b.state == "running" and rig.workers[0].running == [b]
    rig.workers[0].answer(b, OK)
    assert rig.one("a").status == rig.one("b").status == "success"
    rig.settled()


def test_queue_is_fifo():
    rig = Rig()
    first = rig.call("first")
    order = [rig.call(n) for n in ("b", "c", "d")]
    rig.workers[0].answer(first, OK)
    for call in order:
        assert rig.workers[0].running == [call]
        rig.workers[0].answer(call, OK)
    rig.settled()


@pytest.mark.parametrize(
    ("where", "message"),
    [
        ("queued", "no worker of side was free within 500 ms"),
        ("running", "did not answer within 500 ms"),
        ("backoff", "did not succeed within 500 ms (attempt 1 failed: worker-crashed)"),
    ],
)
def test_deadline_in_each_state(where, message):
    rig = Rig()
    blocker = rig.call("blocker", timeout_ms=10_000)
    if where != "queued":
        rig.workers[0].answer(blocker, OK)
    call = rig.call("x", timeout_ms=500, manifest=RETRY)
    if where == "backoff":
        rig.workers[0].answer(call, CRASH)
    assert call.state == where
    if where == "backoff":
        # The engine backs off only when the retry can start before the deadline, so the
        # deadline timer cannot beat the backoff timer on the heap; the transition is still
        # defined (and safe) should it fire first.
        call.expire()
    else:
        rig.advance(0.499)
        assert rig.envelopes["x"] == []
        rig.advance(0.002)
    env = rig.one("x")
    assert env.status == "failed" and env.error.code == "timeout"
    assert message in env.error.message
    if where == "running":
        assert rig.workers[0].abandoned == [call]
    # Nothing more happens to it: a late answer, a freed slot or a fired backoff change nothing.
    call.ended(OK)
    rig.advance(1.0)
    assert len(rig.envelopes["x"]) == 1 and call.attempts == (0 if where == "queued" else 1)
    if where == "queued":
        rig.workers[0].answer(blocker, OK)
        assert rig.workers[0].running == []
    rig.settled()


@pytest.mark.parametrize("where", ["queued", "running", "backoff"])
def test_cancel_in_each_state(where):
    rig = Rig()
    blocker = rig.call("blocker", timeout_ms=60_000)
    if where == "queued":
        call = rig.call("x")
    else:
        rig.workers[0].answer(blocker, OK)
        call = rig.call("x", manifest=RETRY)
        if where == "backoff":
            rig.workers[0].answer(call, CRASH)
    assert call.state == where
    assert rig.engine.cancel("x", "client disconnected")
    env = rig.one("x")
    assert env.status == "failed" and env.error.code == "cancelled"
    assert env.error.message == "client disconnected"
    assert not rig.engine.cancel("x")
    if where == "running":
        assert rig.workers[0].abandoned == [call]
        call.ended(OK)  # a late answer of an abandoned attempt
    rig.advance(5.0)
    assert len(rig.envelopes["x"]) == 1
    if where == "queued":
        rig.workers[0].answer(blocker, OK)
    rig.settled()


def test_crash_with_retries_left_backs_off_then_runs_again():
    rig = Rig()
    call = rig.call("x", manifest=RETRY)
    rig.workers[0].answer(call, CRASH)
    assert call.state == "backoff" and rig.workers[0].running == []
    rig.advance(0.099)
    assert call.state == "backoff"
    rig.advance(0.002)
    assert call.state == "running"
    rig.workers[0].answer(call, OK)
    env = rig.one("x")
    assert env.status == "success" and env.meta.attempts == 2
    rig.settled()


def test_retries_stop_at_max_attempts():
    rig = Rig()
    call = rig.call("x", manifest=RETRY, timeout_ms=10_000)
    for _ in range(3):
        rig.advance(0.2)
        assert call.state == "running"
        rig.workers[0].answer(call, CRASH)
    env = rig.one("x")
    assert env.error.code == "worker-crashed" and env.meta.attempts == 3
    rig.settled()


def test_crash_without_retry_fails_at_once():
    rig = Rig()
    rig.call("x")
    rig.workers[0].die()
    env = rig.one("x")
    assert env.error.code == "worker-crashed" and env.meta.attempts == 1
    rig.settled()


def test_a_retry_that_cannot_start_before_the_deadline_is_not_tried():
    rig = Rig()
    call = rig.call("x", manifest=RETRY, timeout_ms=150)
    rig.advance(0.1)
    rig.workers[0].answer(call, CRASH)  # the retry would start at 200 ms, past 150 ms
    assert rig.one("x").error.code == "worker-crashed"
    rig.settled()


def test_retried_call_goes_first_in_the_queue():
    rig = Rig()
    call = rig.call("x", manifest=RETRY)
    rig.workers[0].answer(call, CRASH)
    other = rig.call("other")  # takes the free worker while x backs off
    waiting = rig.call("waiting")
    rig.advance(0.2)
    assert call.state == "queued" and rig.dispatch.queue[0] is call
    rig.workers[0].answer(other, OK)
    assert call.state == "running" and waiting.state == "queued"


def test_overloaded_when_the_queue_is_full():
    rig = Rig(queue=2)
    rig.call("a")
    rig.call("b")
    rig.call("c")
    rig.call("d")
    env = rig.one("d")
    assert env.status == "unavailable" and env.error.code == "overloaded"
    assert env.meta.attempts == 0 and "pool.queue=2" in env.error.message


def test_refusal_of_a_failed_sidecar():
    rig = Rig()
    rig.refusal = CallOutcome(ok=False, code="unavailable", error="sidecar side has failed")
    rig.call("x")
    env = rig.one("x")
    assert env.status == "unavailable" and env.meta.attempts == 0
    rig.settled()


def test_shutdown_with_calls_queued_running_and_backing_off():
    rig = Rig(workers=1)
    running = rig.call("running")
    backing = rig.call("backing", manifest=RETRY)  # queued behind running
    queued = rig.call("queued")
    rig.workers[0].answer(running, OK)  # backing runs now
    rig.workers[0].answer(backing, CRASH)  # and backs off; queued runs
    assert (backing.state, queued.state) == ("backoff", "running")
    extra = rig.call("extra")
    assert extra.state == "queued"
    # The pool stops: its queue is refused, its worker ends its calls, the engine ends retries.
    rig.refusal = CallOutcome(ok=False, code="shutting-down", error="sidecar side is stopping")
    rig.dispatch.refuse_all(rig.refusal)
    rig.workers[0].die()
    rig.engine.shutdown("the host is stopping")
    assert rig.one("extra").error.code == "shutting-down"
    assert rig.one("queued").error.code == "worker-crashed"
    assert rig.one("backing").error.code == "shutting-down"
    assert rig.one("running").status == "success"
    rig.settled()


def test_restart_window_calls_wait_for_the_replacement():
    rig = Rig()
    rig.call("a")
    b = rig.call("b")
    rig.workers[0].die()  # a fails (not read-only); b stays queued: no worker now
    assert rig.one("a").error.code == "worker-crashed" and b.state == "queued"
    replacement = FakeWorker(rig.dispatch)
    rig.workers[:] = [replacement]
    rig.dispatch.pump()  # the pool pumps when the replacement is ready
    assert b.state == "running"
    replacement.answer(b, OK)
    assert rig.one("b").status == "success"
    rig.settled()


def test_many_calls_one_envelope_each():
    rig = Rig(workers=2, queue=1000)
    calls = [rig.call(f"c{i}", timeout_ms=1000 + i) for i in range(200)]
    for i, call in enumerate(calls):
        if i % 7 == 0:
            rig.engine.cancel(call.key)
    while any(w.running for w in rig.workers):
        for w in rig.workers:
            if w.running:
                w.answer(w.running[0], OK)
    rig.advance(10)
    for call in calls:
        rig.one(call.key)
    rig.settled()


def test_a_receiver_that_raises_does_not_reach_the_worker(caplog):
    """Delivering an answer or progress runs in the task that ended the call (a worker's
    reader): a receiver raising is logged there, the call still ends once, and the next call
    runs (before, such an error went up that task and ended the host)."""
    rig = Rig()
    call = rig.call("a")

    def broken(env: object) -> None:
        raise OverflowError("no MessagePack form")

    call.on_done = broken
    call.on_progress = broken
    call.progress(msgspec.Raw(b'{"n":1}'))
    rig.workers[0].answer(call, OK)  # raises nothing
    assert call.state == "done" and rig.released.count(("a",)) == 1
    messages = [r.getMessage() for r in caplog.records]
    assert (
        "delivering progress of t#" in messages[0] and "delivering the answer of t#" in messages[1]
    )
    b = rig.call("b")
    rig.workers[0].answer(b, OK)
    assert rig.one("b").status == "success"
    rig.settled()
