"""The monitor of one pool: pings its ready workers, retires idle ones and scales up on queueing.

# Strategy: one task per ready worker ticks at the shorter of the probe interval and
# ``pool.idleMs``. On a tick it notes a worker that has stayed ready for ``resetAfterMs`` (the
# keeper's backoff starts over), retires the worker when it has been idle for ``idleMs`` and the
# pool holds more than ``pool.min`` ready ones with nothing queued, and pings it on the probe
# interval. Pings unanswered count only while the worker is idle (a busy single-threaded worker
# cannot answer); ``failureThreshold`` misses in a row mark the sidecar's probe ``unavailable``
# and kill the worker as ``hung`` (its keeper replaces it). Answered pings become the probe
# facts (``probe``, per-tool health, reasons) the pool publishes. Scale-up: when a call had to
# queue and no worker is starting or waiting out a backoff, the keeper gets one more place, up
# to ``pool.max``.
"""

from __future__ import annotations

from collections.abc import Callable

import trio

from supervisor.contracts import wire
from supervisor.contracts.facts import ToolProbe
from supervisor.contracts.registry import SidecarConfig
from supervisor.contracts.snapshot import ProbeState, Reason
from supervisor.pools.keeper import Keeper
from supervisor.pools.spec import Collaborators
from supervisor.workers.base import Worker


class Monitor:
    """Probes, idle retire and scale-up for the workers of one sidecar.

    Args:
        config: The configuration the pool runs with (``probe``, ``pool``, ``restart``).
        keeper: The pool's keeper (its workers, its places, its restart state).
        links: The pool's collaborators (metering).
        waiting: The number of calls waiting in the pool's queue now.
        changed: Called when the probe facts changed (the pool publishes).
    """

    def __init__(
        self,
        config: SidecarConfig,
        keeper: Keeper,
        links: Collaborators,
        *,
        waiting: Callable[[], int],
        changed: Callable[[], None],
    ) -> None:
        self.sidecar = keeper.sidecar
        self.config = config
        self._keeper = keeper
        self._links = links
        self._waiting = waiting
        self._changed = changed
        self.probe: ProbeState = "skipped" if config.probe.interval_ms == 0 else "healthy"
        """What the last pong said of the sidecar as a whole."""
        self.probe_reason: Reason | None = None
        self.tool_probe: dict[str, ToolProbe] = {}
        """What the last pong said of each tool."""
        self._nursery: trio.Nursery | None = None

    def start(self, nursery: trio.Nursery) -> None:
        """Run the watch tasks of ready workers in ``nursery`` (the pool's: they end with it)."""
        self._nursery = nursery

    def watch(self, worker: Worker) -> None:
        """``worker`` became ready: ping it and retire it when idle, while it stays ready."""
        assert self._nursery is not None
        self._nursery.start_soon(self._watch, worker)

    def scale_up(self) -> None:
        """A call had to queue: add a worker, up to ``pool.max``, unless one is on its way."""
        keeper = self._keeper
        if keeper.stopped or not keeper.running:
            return
        starting = any(w.state == "starting" for w in keeper.workers)
        if not starting and keeper.places < self.config.pool.max and keeper.next_restart_at is None:
            keeper.add()

    def pong(self, worker: Worker, pong: wire.Pong | None) -> None:
        """A worker answered a ping: its health becomes the probe facts."""
        if pong is None:
            return
        default: ProbeState = pong.status
        probes: dict[str, ToolProbe] = {}
        for name, health in pong.tools.items():
            state: ProbeState = health.status
            reason = None
            if state != "healthy":
                reason = Reason(
                    field="probe",
                    code=health.code or "probe-" + state,
                    message=health.reason or f"{self.sidecar} reports {name} {state}",
                    hint=health.hint or f"see `toolhost doctor` for {self.sidecar}",
                )
            probes[name] = ToolProbe(state=state, reason=reason)
        self.tool_probe = probes
        self.probe = default
        self.probe_reason = (
            None
            if default == "healthy"
            else Reason(
                field="probe",
                code="probe-" + default,
                message=f"{self.sidecar} reports itself {default}",
                hint=f"see `toolhost logs {self.sidecar}`",
            )
        )
        self._changed()

    async def _watch(self, worker: Worker) -> None:
        probe = self.config.probe
        interval = probe.interval_ms / 1000.0
        idle = self.config.pool.idle_ms / 1000.0
        ticks = [t for t in (interval, idle) if t > 0]
        if not ticks:
            return
        tick = min(ticks)
        misses = 0
        last_ping = trio.current_time()
        stable_after = self.config.restart.reset_after_ms / 1000.0
        stable_noted = False
        metering = self._links.metering
        while worker.state == "ready":
            await trio.sleep(tick)
            if worker.state != "ready":
                return
            now = trio.current_time()
            if (
                not stable_noted
                and worker.ready_at is not None
                and now - worker.ready_at >= stable_after
            ):
                stable_noted = True
                self._keeper.stable()
            if idle > 0 and self._may_retire(worker, now, idle):
                assert self._nursery is not None
                self._nursery.start_soon(lambda: worker.stop("retired"))
                return
            if interval > 0 and now - last_ping >= interval - 1e-9:
                last_ping = now
                pong = await worker.ping(probe.timeout_ms / 1000.0)
                if metering is not None:
                    metering.probed(self.sidecar, trio.current_time() - now, pong is not None)
                if worker.state != "ready":
                    return
                if pong is None:
                    if worker.inflight == 0:
                        misses += 1
                    if misses >= probe.failure_threshold:
                        self.probe = "unavailable"
                        self.tool_probe = {}
                        self.probe_reason = Reason(
                            field="probe",
                            code="probe-timeout",
                            message=f"{misses} consecutive pings unanswered within "
                            f"{probe.timeout_ms} ms",
                            hint=f"the worker is replaced; see `toolhost logs {self.sidecar}`",
                        )
                        self._changed()
                        worker.kill("hung", f"{misses} consecutive probes unanswered")
                        return
                else:
                    misses = 0
                    self.pong(worker, pong)

    def _may_retire(self, worker: Worker, now: float, idle: float) -> bool:
        live = sum(1 for w in self._keeper.workers if w.state == "ready")
        return (
            live > self.config.pool.min
            and worker.load == 0
            and not self._waiting()
            and now - worker.last_active >= idle
        )
