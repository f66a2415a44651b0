"""The host's timer heap: due order, cancellation, compaction, the driver's wake-up."""

import math

from supervisor.calls.timers import COMPACT_MIN, Timers


def test_fires_due_timers_in_order_and_only_those():
    t = Timers()
    fired = []
    for when in (3.0, 1.0, 2.0, 1.0):
        t.at(when, lambda w=when: fired.append(w))
    assert t.fire(0.5) == 0 and fired == []
    assert t.fire(2.0) == 3 and fired == [1.0, 1.0, 2.0]
    assert t.next_due() == 3.0 and len(t) == 1
    t.fire(10)
    assert fired[-1] == 3.0 and t.next_due() == math.inf


def test_cancelled_timers_never_fire_and_are_compacted():
    t = Timers()
    fired = []
    timers = [t.at(float(i), lambda i=i: fired.append(i)) for i in range(4 * COMPACT_MIN)]
    for timer in timers[1:]:
        t.cancel(timer)
    t.cancel(timers[1])  # twice is a no-op
    t.cancel(None)
    assert len(t) == 1
    assert len(t._heap) < 2 * COMPACT_MIN + 2  # rebuilt, not grown with dead entries
    t.fire(1e9)
    assert fired == [0]
    t.cancel(timers[0])  # after it fired: a no-op
    assert len(t) == 0


def test_an_earlier_timer_rearms_the_driver():
    t = Timers()
    rearms = []
    t.rearm = rearms.append
    t.sleeping_until = 5.0
    t.at(6.0, lambda: None)
    assert rearms == []
    t.at(4.0, lambda: None)
    assert rearms == [4.0] and t.sleeping_until == 4.0


def test_a_timer_may_schedule_another_from_its_callback():
    t = Timers()
    fired = []
    t.at(1.0, lambda: t.at(1.5, lambda: fired.append("second")))
    t.fire(1.0)
    assert fired == [] and t.next_due() == 1.5
    t.fire(2.0)
    assert fired == ["second"]
