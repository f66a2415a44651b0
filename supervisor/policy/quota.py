"""The quota ledger: calls per minute, calls per day and calls at once, per sidecar and per tool.

# Strategy: pure state, time passed in. Each *key* (``sidecar:<id>`` or ``tool:<name>``) has its
# limits and its counters. ``callsPerMinute`` is a sliding window: the admission times of the
# last N calls in a deque of length N, so "at most N calls in any 60 s" is exact and a refusal
# knows the moment the oldest of them leaves the window (``retryAfterMs``). ``callsPerDay``
# counts calls per UTC day (wall-clock milliseconds are passed in for that one rule only, and
# the counts can be saved and restored). ``maxConcurrent`` counts calls between admit and
# release. An admission checks every key of a call first and charges them only if all allow it,
# so a refused call costs nothing. Work per call is O(keys), a handful of comparisons.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from typing import Literal

import msgspec

MINUTE_MS = 60_000.0
DAY_MS = 86_400_000

Rule = Literal["callsPerMinute", "callsPerDay", "maxConcurrent"]
WINDOW_RULES: tuple[Rule, ...] = ("callsPerMinute", "callsPerDay")


class Limits(msgspec.Struct, frozen=True, kw_only=True):
    """The quota of one key; 0 means unlimited."""

    per_minute: int = 0
    per_day: int = 0
    concurrent: int = 0

    @property
    def empty(self) -> bool:
        return not (self.per_minute or self.per_day or self.concurrent)


class Refusal(msgspec.Struct, frozen=True, kw_only=True):
    """Why a call is refused now, and when it may come back."""

    key: str
    rule: Rule
    limit: int
    retry_after_ms: int


def refusal_message(tool: str, refusal: Refusal) -> str:
    """``file.hash: quota.tools.file.hash.callsPerMinute=3 reached; retry in 41250 ms``: the
    rule, its registry path and limit, and the wait (docs/quotas-and-limits.md)."""
    scope, _, name = refusal.key.partition(":")
    where = f"sidecars.{name}.quota" if scope == "sidecar" else f"quota.tools.{name}"
    ms = refusal.retry_after_ms
    return f"{tool}: {where}.{refusal.rule}={refusal.limit} reached; retry in {ms} ms"


def refusal_details(refusal: Refusal) -> dict[str, int | str]:
    """The ``error.details`` of a ``quota-limited`` answer."""
    return {
        "retryAfterMs": refusal.retry_after_ms,
        "rule": refusal.rule,
        "limit": refusal.limit,
        "scope": refusal.key,
    }


class _Key:
    __slots__ = ("day", "day_count", "inflight", "limits", "window")

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.window: deque[float] = deque(maxlen=limits.per_minute or None)
        self.day = -1
        self.day_count = 0
        self.inflight = 0

    def reshape(self, limits: Limits) -> None:
        if limits.per_minute != self.limits.per_minute:
            keep = list(self.window)[-limits.per_minute :] if limits.per_minute else []
            self.window = deque(keep, maxlen=limits.per_minute or None)
        self.limits = limits


def _ceil_ms(ms: float) -> int:
    return max(1, math.ceil(ms))


class Ledger:
    """Counters for every key that has a quota.

    Keys without limits are not stored: :meth:`admit` skips unknown keys, so tools and sidecars
    without quotas pay one dict lookup per key.
    """

    def __init__(self) -> None:
        self._keys: dict[str, _Key] = {}
        self.day_dirty = False
        """A ``callsPerDay`` count changed since :meth:`day_counts` was last read."""

    # configuration -----------------------------------------------------------------------

    def configure(self, limits: Mapping[str, Limits]) -> None:
        """Install the limits of every key; counters of keys that stay are kept."""
        keys: dict[str, _Key] = {}
        for name, lim in limits.items():
            if lim.empty:
                continue
            old = self._keys.get(name)
            if old is None:
                keys[name] = _Key(lim)
            else:
                old.reshape(lim)
                keys[name] = old
        self._keys = keys

    def limits(self, key: str) -> Limits | None:
        k = self._keys.get(key)
        return k.limits if k is not None else None

    def __contains__(self, key: str) -> bool:
        return key in self._keys

    def __len__(self) -> int:
        """Keys that have a quota."""
        return len(self._keys)

    # the call path -----------------------------------------------------------------------

    def admit(
        self,
        keys: Sequence[str],
        now: float,
        wall: float,
        *,
        busy_retry_ms: int = 100,
    ) -> Refusal | None:
        """Admit one call charged to every key in ``keys``, or say why not.

        Args:
            keys: The call's keys (unknown keys have no quota).
            now: Monotonic time in milliseconds.
            wall: Wall-clock time in milliseconds since the epoch (for ``callsPerDay``).
            busy_retry_ms: The ``retryAfterMs`` hint of a ``maxConcurrent`` refusal (nothing in
                the ledger knows when a running call ends).

        Returns:
            None when admitted (every key charged), else the refusal with the longest wait.
        """
        table = self._keys
        found = [(n, k) for n in keys if (k := table.get(n)) is not None]
        if not found:
            return None
        worst: Refusal | None = None
        day = int(wall // DAY_MS)
        for name, k in found:
            refusal = self._check(name, k, now, wall, day, busy_retry_ms)
            if refusal is not None and (
                worst is None or refusal.retry_after_ms > worst.retry_after_ms
            ):
                worst = refusal
        if worst is not None:
            return worst
        for _, k in found:
            lim = k.limits
            if lim.per_minute:
                k.window.append(now)
            if lim.per_day:
                k.day_count += 1
                self.day_dirty = True
            if lim.concurrent:
                k.inflight += 1
        return None

    @staticmethod
    def _check(
        name: str, k: _Key, now: float, wall: float, day: int, busy_retry_ms: int
    ) -> Refusal | None:
        lim = k.limits
        worst: Refusal | None = None
        if lim.per_minute and len(k.window) >= lim.per_minute:
            wait = k.window[0] + MINUTE_MS - now
            if wait > 0:
                worst = Refusal(
                    key=name,
                    rule="callsPerMinute",
                    limit=lim.per_minute,
                    retry_after_ms=_ceil_ms(wait),
                )
        if lim.per_day:
            if k.day != day:
                k.day, k.day_count = day, 0
            if k.day_count >= lim.per_day:
                wait = DAY_MS - (wall % DAY_MS)
                if worst is None or wait > worst.retry_after_ms:
                    worst = Refusal(
                        key=name,
                        rule="callsPerDay",
                        limit=lim.per_day,
                        retry_after_ms=_ceil_ms(wait),
                    )
        if worst is None and lim.concurrent and k.inflight >= lim.concurrent:
            worst = Refusal(
                key=name,
                rule="maxConcurrent",
                limit=lim.concurrent,
                retry_after_ms=max(1, busy_retry_ms),
            )
        return worst

    def release(self, keys: Iterable[str]) -> None:
        """A call admitted under ``keys`` ended (frees its ``maxConcurrent`` place)."""
        for name in keys:
            k = self._keys.get(name)
            if k is not None and k.limits.concurrent and k.inflight > 0:
                k.inflight -= 1

    # windows -----------------------------------------------------------------------------

    def blocked_ms(self, key: str, now: float, wall: float) -> int:
        """How long the window quotas of ``key`` refuse every call (0: a call would pass now).

        ``maxConcurrent`` is not a window: it frees the moment a call ends, so it never blocks.
        """
        refusal = self.blocking(key, now, wall)
        return refusal.retry_after_ms if refusal is not None else 0

    def blocking(self, key: str, now: float, wall: float) -> Refusal | None:
        """The window refusal (rule, limit, wait) every call of ``key`` gets now, if any."""
        k = self._keys.get(key)
        if k is None:
            return None
        refusal = self._check(key, k, now, wall, int(wall // DAY_MS), 0)
        if refusal is None or refusal.rule == "maxConcurrent":
            return None
        return refusal

    def usage(self, key: str, now: float, wall: float) -> dict[str, int]:
        """Counts of ``key`` now: calls in the last minute, today, and running."""
        k = self._keys.get(key)
        if k is None:
            return {}
        out: dict[str, int] = {}
        if k.limits.per_minute:
            out["callsLastMinute"] = sum(1 for t in k.window if now - t < MINUTE_MS)
        if k.limits.per_day:
            out["callsToday"] = k.day_count if k.day == int(wall // DAY_MS) else 0
        if k.limits.concurrent:
            out["running"] = k.inflight
        return out

    # persistence of the daily counts -----------------------------------------------------

    def day_counts(self, wall: float) -> tuple[int, dict[str, int]]:
        """Today's (UTC day number) ``callsPerDay`` counts, for the state file."""
        day = int(wall // DAY_MS)
        self.day_dirty = False
        counts = {
            name: k.day_count
            for name, k in self._keys.items()
            if k.limits.per_day and k.day == day and k.day_count
        }
        return day, counts

    def restore_day(self, day: int, counts: Mapping[str, int], wall: float) -> None:
        """Load saved counts; counts of another day than today's are dropped."""
        if day != int(wall // DAY_MS):
            return
        for name, count in counts.items():
            k = self._keys.get(name)
            if k is not None and k.limits.per_day and count > 0:
                k.day, k.day_count = day, max(k.day_count if k.day == day else 0, int(count))
