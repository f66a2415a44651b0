"""A latency histogram with fixed log-scale buckets: O(1) to record, bounded memory.

# Strategy: bucket ``i`` holds durations in ``(BASE * R**(i-1), BASE * R**i]`` milliseconds with
# ``R = 2**(1/4)`` (about 19 % wide), from 10 microseconds to about 22 minutes, plus an overflow
# bucket. Recording is one ``log2``, one ``ceil`` and one list increment; a quantile is read back
# as the upper bound of the bucket that holds it (so it is at most 19 % high), except that it is
# never reported above the exact maximum.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

BASE_MS = 0.01
STEPS_PER_DOUBLING = 4
DOUBLINGS = 27
BUCKETS = STEPS_PER_DOUBLING * DOUBLINGS + 1
"""Bucket ``BUCKETS - 1`` holds everything over the last bound."""


def upper_bound(index: int) -> float:
    """The upper bound (ms) of bucket ``index`` (``inf`` for the overflow bucket)."""
    if index >= BUCKETS - 1:
        return math.inf
    return BASE_MS * 2.0 ** (index / STEPS_PER_DOUBLING)


class Histogram:
    """Counts of durations (ms) per bucket, with count, sum and exact max."""

    __slots__ = ("buckets", "count", "max", "total")

    def __init__(self) -> None:
        self.buckets = [0] * BUCKETS
        self.count = 0
        self.total = 0.0
        self.max = 0.0

    def record(self, ms: float) -> None:
        """Add one duration in milliseconds."""
        if ms <= BASE_MS:
            index = 0
        else:
            index = math.ceil(math.log2(ms / BASE_MS) * STEPS_PER_DOUBLING - 1e-9)
            if index >= BUCKETS:
                index = BUCKETS - 1
        self.buckets[index] += 1
        self.count += 1
        self.total += ms
        if ms > self.max:
            self.max = ms

    def quantile(self, q: float) -> float:
        """The duration (ms) at or below which a fraction ``q`` of the recorded ones fall."""
        if self.count == 0:
            return 0.0
        rank = max(1, math.ceil(q * self.count))
        seen = 0
        for index, n in enumerate(self.buckets):
            seen += n
            if seen >= rank:
                return min(upper_bound(index), self.max)
        return self.max

    def cumulative(self, bounds_ms: list[float]) -> Iterator[tuple[float, int]]:
        """``(bound, count of durations <= bound)`` for bucket bounds (Prometheus ``le``).

        Each bound is rounded to the bucket whose upper bound it falls in (exact for the powers of
        two of ``BASE_MS``).
        """
        seen = 0
        index = 0
        for bound in bounds_ms:
            while index < BUCKETS - 1 and upper_bound(index) <= bound * (1 + 1e-9):
                seen += self.buckets[index]
                index += 1
            yield bound, seen

    def merge(self, other: Histogram) -> None:
        """Add ``other``'s counts into this one."""
        for i, n in enumerate(other.buckets):
            if n:
                self.buckets[i] += n
        self.count += other.count
        self.total += other.total
        self.max = max(self.max, other.max)
