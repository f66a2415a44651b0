"""Host-wide protection against restart storms: a cap on concurrent worker starts and a token
bucket on restarts.

# Strategy: every pool asks the one :class:`HostGuard` of its host before starting a worker
# (:meth:`HostGuard.start_slot`, a FIFO ``trio.CapacityLimiter`` held from spawn until the worker
# is ready or gone) and before each restart after a failure (:meth:`HostGuard.restart_token`, the
# pure :class:`~supervisor.policy.ratelimit.TokenBucket`). Because the limiter is FIFO, a healthy
# sidecar's first start queues behind at most one start of every other sidecar; because restarts
# are paced host-wide, twenty crash-looping sidecars cannot take the machine from the rest.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import msgspec
import trio

from supervisor.policy.ratelimit import TokenBucket

GRANT_LOG = 512


class GuardStats(msgspec.Struct, kw_only=True):
    """What the guard did (``system.stats`` ``host``)."""

    maxConcurrentSpawns: int
    spawning: int
    waitingToSpawn: int
    spawns: int
    maxRestartsPerSecond: float
    restarts: int
    restartsDelayed: int


class HostGuard:
    """Spawn slots and the restart budget shared by every pool of a host.

    Args:
        max_spawns: Workers starting at once.
        restarts_per_second: Restart rate (0: unlimited).
        burst: Restarts allowed at once.
    """

    def __init__(self, max_spawns: int = 4, restarts_per_second: float = 10.0, burst: int = 10):
        self.limiter = trio.CapacityLimiter(max(1, max_spawns))
        self.bucket = TokenBucket(restarts_per_second, burst, 0.0)
        self._holders: set[Any] = set()
        self.spawns = 0
        self.grants: deque[tuple[str, bool, float]] = deque(maxlen=GRANT_LOG)
        """``(sidecar, is_restart, trio time)`` of the latest slot grants, oldest first."""

    def configure(self, max_spawns: int, restarts_per_second: float, burst: int) -> None:
        """Apply new settings (a registry reload); waiting reservations keep their order."""
        self.limiter.total_tokens = max(1, max_spawns)
        self.bucket.rate = restarts_per_second
        self.bucket.burst = max(1, burst)

    async def start_slot(self, holder: Any, sidecar: str, *, restart: bool = False) -> None:
        """Wait for a start slot for ``holder`` (a worker); FIFO among all pools."""
        await self.limiter.acquire_on_behalf_of(holder)
        self._holders.add(holder)
        self.spawns += 1
        self.grants.append((sidecar, restart, trio.current_time()))

    def release(self, holder: Any) -> None:
        """``holder`` is ready or gone: give its slot to the next in line (idempotent)."""
        if holder in self._holders:
            self._holders.discard(holder)
            self.limiter.release_on_behalf_of(holder)

    async def restart_token(self) -> float:
        """Wait until the restart budget allows one more restart; returns the wait (seconds)."""
        wait_ms = self.bucket.reserve(trio.current_time() * 1000.0)
        if wait_ms > 0:
            await trio.sleep(wait_ms / 1000.0)
        return wait_ms / 1000.0

    def stats(self) -> GuardStats:
        st = self.limiter.statistics()
        return GuardStats(
            maxConcurrentSpawns=int(self.limiter.total_tokens),
            spawning=st.borrowed_tokens,
            waitingToSpawn=st.tasks_waiting,
            spawns=self.spawns,
            maxRestartsPerSecond=self.bucket.rate,
            restarts=self.bucket.granted,
            restartsDelayed=self.bucket.waited,
        )
