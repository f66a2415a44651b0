"""One timer structure per host: call deadlines and retry backoff, driven by one task.

# Strategy: a binary heap of :class:`Timer` entries ordered by due time. Cancelling a timer only
# marks it dead (O(1)); dead entries are dropped when they reach the top, and the heap is rebuilt
# when they outnumber the live ones, so a burst of calls that all finish early costs no more than
# the calls themselves. :class:`Timers` knows nothing of trio or the clock: :meth:`Timers.fire`
# takes ``now``, which is what lets the unit tests drive every deadline on a fake clock.
# The one trio task that sleeps until the earliest entry and fires what is due is
# ``Invoker.run_timers``; a timer earlier than the one it sleeps for moves its cancel scope's
# deadline (no task wake-up, no event: trio itself wakes it at the new time).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable

COMPACT_MIN = 256
"""Dead entries tolerated before the heap may be rebuilt."""


class Timer:
    """One scheduled callback (cancel it with :meth:`Timers.cancel`)."""

    __slots__ = ("fn", "live", "when")

    def __init__(self, when: float, fn: Callable[[], None]) -> None:
        self.when = when
        self.fn = fn
        self.live = True


class Timers:
    """A heap of timers; pure (time comes in as ``now``)."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Timer]] = []
        self._seq = 0
        self._dead = 0
        self.sleeping_until = math.inf
        """When the driver will look next; an earlier timer moves it through :attr:`rearm`."""
        self.rearm: Callable[[float], None] = lambda when: None

    def __len__(self) -> int:
        return len(self._heap) - self._dead

    def at(self, when: float, fn: Callable[[], None]) -> Timer:
        """Call ``fn`` at ``when`` (seconds, the driver's clock)."""
        timer = Timer(when, fn)
        self._seq += 1
        heapq.heappush(self._heap, (when, self._seq, timer))
        if when < self.sleeping_until:
            self.sleeping_until = when
            self.rearm(when)
        return timer

    def cancel(self, timer: Timer | None) -> None:
        """Forget ``timer`` (a no-op for None or a timer that already fired)."""
        if timer is None or not timer.live:
            return
        timer.live = False
        self._dead += 1
        if self._dead > COMPACT_MIN and self._dead * 2 > len(self._heap):
            self._heap = [entry for entry in self._heap if entry[2].live]
            heapq.heapify(self._heap)
            self._dead = 0

    def next_due(self) -> float:
        """The due time of the earliest live timer (inf when there is none)."""
        heap = self._heap
        while heap and not heap[0][2].live:
            heapq.heappop(heap)
            self._dead -= 1
        return heap[0][0] if heap else math.inf

    def fire(self, now: float) -> int:
        """Run every timer due at ``now`` (in due order); returns how many ran."""
        heap = self._heap
        ran = 0
        while heap and heap[0][0] <= now:
            _, _, timer = heapq.heappop(heap)
            if not timer.live:
                self._dead -= 1
                continue
            timer.live = False
            timer.fn()
            ran += 1
        return ran
