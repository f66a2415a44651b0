"""The direct gear's deadline queue, on trio's mock clock (no real waiting)."""

import trio
import trio.testing

from supervisor.runtime.invoke import DeadlineQueue


class FakePrep:
    def __init__(self, timeout):
        self.timeout = timeout


class FakeCall:
    def __init__(self, timeout, now):
        self.prep = FakePrep(timeout)
        self.deadline = now + timeout / 1000.0
        self.finished = False
        self.queue = None
        self.expired_at = None

    def expire(self):
        self.expired_at = trio.current_time()
        self.finished = True


async def run_scenario():
    q = DeadlineQueue()
    async with trio.open_nursery() as n:
        n.start_soon(q.run)
        await trio.sleep(0)
        t0 = trio.current_time()
        slow = FakeCall(1000, t0)
        q.add(slow)
        fast = FakeCall(100, t0)  # an earlier deadline than the queue sleeps for: it must wake
        q.add(fast)
        done = FakeCall(100, t0)
        q.add(done)
        done.finished = True  # answered in time: never expired
        await trio.sleep(0.5)
        assert fast.expired_at is not None and abs(fast.expired_at - t0 - 0.1) < 1e-6
        assert done.expired_at is None and slow.expired_at is None
        await trio.sleep(1)
        assert abs(slow.expired_at - t0 - 1.0) < 1e-6
        # Many finished calls behind a live one are compacted away.
        live = FakeCall(60_000, trio.current_time())
        q.add(live)
        for _ in range(1000):
            c = FakeCall(60_000, trio.current_time())
            q.add(c)
            c.finished = True
            c.queue.live -= 1
        assert len(q._queues[60_000]) < 200
        n.cancel_scope.cancel()


def test_deadlines_fire_in_order_and_only_for_unfinished_calls():
    trio.run(run_scenario, clock=trio.testing.MockClock(autojump_threshold=0))
