"""Call quotas at run time: the pure ledger, the ``quota-limited`` flag in the catalog, the timer
that clears it, and the ``callsPerDay`` state file.

# Strategy: :meth:`Quotas.admit` is on the call path and stays O(keys): one dict lookup when the
# sidecar and the tool have no quota, else the ledger's check-then-charge. When an admission
# fills a window (the Nth call of the minute, the last call of the day), the tools under that
# key are marked ``sandbox: quota-limited`` in the catalog at once (so the model stops seeing
# them before it is refused) and the key goes on a heap of deadlines; one timer task owned by
# the host sleeps until the earliest and clears the flag the moment the window lets a call in
# again. ``maxConcurrent`` refuses per call but never flips the catalog: it frees as soon as a
# running call ends. Daily counts are written to ``host.quotaState`` by a background task at
# most once a second (and on stop), never on the call path.
"""

from __future__ import annotations

import contextlib
import heapq
import json
import logging
import os
import time
from collections.abc import Callable

import trio

from supervisor.contracts.envelope import Envelope
from supervisor.contracts.snapshot import Descriptor
from supervisor.policy import results
from supervisor.policy.quota import Ledger, Limits, Refusal, refusal_details, refusal_message
from supervisor.private_files import open_private
from supervisor.registry.catalog import CatalogState
from supervisor.registry.plan import Plan

log = logging.getLogger("toolhost.quota")

SAVE_EVERY_S = 1.0
STATE_VERSION = 1
NO_KEYS: tuple[str, ...] = ()


def _mono_ms() -> float:
    return trio.current_time() * 1000.0


def _wall_ms() -> float:
    return time.time() * 1000.0


def load_state(path: str) -> tuple[int, dict[str, int]]:
    """Read the saved ``callsPerDay`` counts: ``(UTC day number, counts by key)``."""
    try:
        fd = open_private(path, os.O_RDONLY, create=False)  # never through a symlink
        with os.fdopen(fd, "rb") as f:
            doc = json.loads(f.read())
        if doc.get("version") != STATE_VERSION:
            return -1, {}
        counts = {str(k): int(v) for k, v in dict(doc.get("counts", {})).items()}
        return int(doc["day"]), counts
    except FileNotFoundError:
        return -1, {}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        log.warning("quota state %s is unreadable (%s); daily counts start at 0", path, exc)
        return -1, {}


def save_state(path: str, day: int, counts: dict[str, int]) -> None:
    """Write the counts atomically (temporary file, then rename)."""
    folder = os.path.dirname(path)
    if folder:
        os.makedirs(folder, mode=0o700, exist_ok=True)
    tmp = f"{path}.tmp"
    data = json.dumps({"version": STATE_VERSION, "day": day, "counts": counts}, sort_keys=True)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)  # a stale one (or a link: removed, never followed); a new one is 0600
    fd = open_private(tmp, os.O_WRONLY | os.O_TRUNC)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(data + "\n")
    os.replace(tmp, path)


class Quotas:
    """The host's quota state.

    Args:
        catalog: The catalog whose ``sandbox`` fields show ``quota-limited``.
        changed: Receives the descriptors that changed (the host publishes them).
        state_path: The ``callsPerDay`` state file (None: counts live in memory only).
        latency_hint: The ``retryAfterMs`` of a ``maxConcurrent`` refusal for a tool (its
            median latency).
    """

    def __init__(
        self,
        catalog: CatalogState,
        changed: Callable[[list[Descriptor]], None],
        state_path: str | None = None,
        latency_hint: Callable[[str], float] = lambda tool: 100.0,
    ) -> None:
        self.ledger = Ledger()
        self.catalog = catalog
        self._changed = changed
        self.state_path = state_path
        self._restored = False
        self._keys: dict[tuple[str, str], tuple[str, ...]] = {}
        self._limited: dict[str, int] = {}
        self._due: list[tuple[float, str]] = []
        self._wake = trio.Event()
        self._save = trio.Event()
        self.latency_hint = latency_hint

    # configuration -----------------------------------------------------------------------

    def configure(self, plan: Plan) -> None:
        """Install every sidecar's and tool's quota (start and reload)."""
        limits: dict[str, Limits] = {}
        for sid, sp in plan.sidecars.items():
            cfg = sp.config
            if cfg is None:
                continue
            q = cfg.quota
            limits[f"sidecar:{sid}"] = Limits(
                per_minute=q.calls_per_minute, per_day=q.calls_per_day, concurrent=q.max_concurrent
            )
            for tool, tq in q.tools.items():
                limits[f"tool:{tool}"] = Limits(
                    per_minute=tq.calls_per_minute,
                    per_day=tq.calls_per_day,
                    concurrent=tq.max_concurrent,
                )
        self.ledger.configure(limits)
        self._keys.clear()
        if not self._restored and self.state_path:
            self._restored = True
            day, counts = load_state(self.state_path)
            self.ledger.restore_day(day, counts, _wall_ms())
        # Windows full after a reload (or a restore) show at once; cleared ones clear.
        for tool in list(self._limited):
            self._reassess(tool)
        for key in {k for k in limits if k in self.ledger}:
            self._flip(key)

    def keys(self, sidecar: str | None, tool: str) -> tuple[str, ...]:
        """The ledger keys a call of ``tool`` is charged to (cached)."""
        if not self.ledger:
            return NO_KEYS
        cached = self._keys.get((sidecar or "", tool))
        if cached is None:
            ledger = self.ledger
            cached = tuple(k for k in (f"sidecar:{sidecar}", f"tool:{tool}") if k in ledger)
            self._keys[(sidecar or "", tool)] = cached
        return cached

    # the call path -----------------------------------------------------------------------

    def admit(self, sidecar: str | None, tool: str) -> Refusal | tuple[str, ...]:
        """Admit a call (returns its keys, for :meth:`release`) or refuse it."""
        keys = self.keys(sidecar, tool)
        if not keys:
            return keys
        now = _mono_ms()
        refusal = self.ledger.admit(keys, now, _wall_ms())
        if refusal is not None:
            if refusal.rule == "maxConcurrent":
                hint = max(1, round(self.latency_hint(tool)))
                refusal = Refusal(
                    key=refusal.key, rule=refusal.rule, limit=refusal.limit, retry_after_ms=hint
                )
            return refusal
        if self.ledger.day_dirty:
            self._save.set()
        for key in keys:
            self._flip(key)
        return keys

    def release(self, keys: tuple[str, ...]) -> None:
        if keys:
            self.ledger.release(keys)

    def blocking(self, sidecar: str | None, tool: str) -> Refusal | None:
        """The window quota that refuses ``tool`` now with the longest wait (None: none does)."""
        now, wall = _mono_ms(), _wall_ms()
        found = [r for k in self.keys(sidecar, tool) if (r := self.ledger.blocking(k, now, wall))]
        return max(found, key=lambda r: r.retry_after_ms, default=None)

    # the quota-limited flag --------------------------------------------------------------

    def _tools_of(self, key: str) -> list[str]:
        kind, _, name = key.partition(":")
        if kind == "tool":
            return [name] if self.catalog.get(name) is not None else []
        return [d.name for d in self.catalog.tools() if d.sidecar == name]

    def _flip(self, key: str) -> None:
        """If ``key``'s window is full, mark its tools quota-limited and set the timer."""
        blocked = self.ledger.blocked_ms(key, _mono_ms(), _wall_ms())
        if blocked <= 0:
            return
        changed: list[Descriptor] = []
        for tool in self._tools_of(key):
            if tool not in self._limited:
                self._limited[tool] = blocked
                changed += self.catalog.set_quota(tool, blocked)
        heapq.heappush(self._due, (_mono_ms() + blocked, key))
        self._wake.set()
        if changed:
            self._changed(changed)

    def _reassess(self, tool: str) -> None:
        """Clear ``tool``'s flag when none of its keys blocks any more."""
        owner = self.catalog.owner(tool)
        now, wall = _mono_ms(), _wall_ms()
        keys = self.keys(owner, tool)
        if any(self.ledger.blocked_ms(k, now, wall) > 0 for k in keys):
            return
        self._limited.pop(tool, None)
        self._changed(self.catalog.set_quota(tool, None))

    def is_limited(self, tool: str) -> bool:
        return tool in self._limited

    def limited_tools(self, sidecar: str) -> list[str]:
        return sorted(t for t in self._limited if self.catalog.owner(t) == sidecar)

    def usage(self, key: str) -> dict[str, int]:
        return self.ledger.usage(key, _mono_ms(), _wall_ms())

    # background --------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """The timer that clears ``quota-limited`` flags, and the state-file writer."""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._timer)
            if self.state_path:
                nursery.start_soon(self._saver)
            task_status.started()

    async def _timer(self) -> None:
        while True:
            self._wake = trio.Event()
            if not self._due:
                await self._wake.wait()
                continue
            due = self._due[0][0]
            with trio.move_on_at(due / 1000.0):
                await self._wake.wait()
            now = _mono_ms()
            while self._due and self._due[0][0] <= now:
                _, key = heapq.heappop(self._due)
                blocked = self.ledger.blocked_ms(key, now, _wall_ms())
                if blocked > 0:
                    heapq.heappush(self._due, (now + blocked, key))
                    continue
                for tool in self._tools_of(key):
                    if tool in self._limited:
                        self._reassess(tool)

    async def _saver(self) -> None:
        path = self.state_path
        assert path is not None
        try:
            while True:
                await self._save.wait()
                self._save = trio.Event()
                day, counts = self.ledger.day_counts(_wall_ms())
                try:
                    await trio.to_thread.run_sync(save_state, path, day, counts)
                except OSError as exc:
                    log.error("cannot write quota state %s: %s", path, exc)
                await trio.sleep(SAVE_EVERY_S)
        finally:
            if self.ledger.day_dirty:
                day, counts = self.ledger.day_counts(_wall_ms())
                with contextlib.suppress(OSError):
                    save_state(path, day, counts)


def refusal_envelope(tool: str, sidecar: str | None, refusal: Refusal) -> Envelope:
    """The ``unavailable`` / ``quota-limited`` answer to a refused call."""
    return results.unavailable(
        tool,
        "quota-limited",
        refusal_message(tool, refusal),
        details=refusal_details(refusal),
        sidecar=sidecar,
    )
