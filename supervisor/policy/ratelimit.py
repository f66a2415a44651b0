"""A token bucket for host-wide rates (worker restarts per second).

# Strategy: pure, time passed in (ms). :meth:`TokenBucket.reserve` always succeeds and says how
# long the caller must wait: tokens may go below zero, so callers are served in the order they
# reserved (no thundering herd, no starvation) and the long-run rate never exceeds ``rate``.
"""

from __future__ import annotations


class TokenBucket:
    """``rate`` tokens per second, at most ``burst`` saved up.

    Args:
        rate: Tokens per second; 0 or less means unlimited (every reservation waits 0).
        burst: Bucket size: how many can go at once after a quiet spell.
        now: Creation time in milliseconds (the bucket starts full).
    """

    __slots__ = ("_last", "_tokens", "burst", "granted", "rate", "waited")

    def __init__(self, rate: float, burst: int, now: float) -> None:
        self.rate = rate
        self.burst = max(1, burst)
        self._tokens = float(self.burst)
        self._last = now
        self.granted = 0
        """Reservations made."""
        self.waited = 0
        """Reservations that had to wait (the bucket was empty)."""

    def reserve(self, now: float) -> float:
        """Take one token; returns the milliseconds to wait before using it (0: go now)."""
        self.granted += 1
        if self.rate <= 0:
            return 0.0
        elapsed = max(0.0, now - self._last)
        self._last = max(self._last, now)
        self._tokens = min(float(self.burst), self._tokens + elapsed * self.rate / 1000.0)
        self._tokens -= 1.0
        if self._tokens >= 0:
            return 0.0
        self.waited += 1
        return -self._tokens * 1000.0 / self.rate

    def available(self, now: float) -> float:
        """Tokens that could be taken now without waiting (negative: reservations queued)."""
        if self.rate <= 0:
            return float(self.burst)
        elapsed = max(0.0, now - self._last)
        return min(float(self.burst), self._tokens + elapsed * self.rate / 1000.0)
