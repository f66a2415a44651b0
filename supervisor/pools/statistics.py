"""One reading of a pool (:class:`PoolStatistics`) and the sidecar's status row derived from it.

# Strategy: like trio's ``statistics()``, a pool answers every question about itself with one
# frozen record, read at once. The record *is* the plain facts the pure
# :func:`supervisor.policy.pool_facts.sidecar_facts` maps to the snapshot (it extends
# :class:`~supervisor.policy.pool_facts.PoolState`), plus what the status row, ``system.stats``
# and ``toolhost doctor`` read: the worker rows, the queue, the places kept, starts and exits by
# reason, the last exit, and the facts last published to the catalog. So the snapshot facts and
# the status row are two pure functions of one record, and nobody reads a pool's insides.
"""

from __future__ import annotations

from typing import Any

import msgspec

from supervisor.contracts.facts import SidecarFacts
from supervisor.contracts.registry import SidecarConfig
from supervisor.contracts.snapshot import SidecarStatus, WorkerStatus
from supervisor.policy.pool_facts import PoolState, sidecar_facts
from supervisor.workers.base import Worker, WorkerExit


class PoolStatistics(PoolState, frozen=True, kw_only=True):
    """What a pool knows now: the snapshot's facts (:class:`PoolState`) and its counters."""

    workers: tuple[WorkerStatus, ...] = ()
    """Every live worker's row, in start order."""
    queued: int = 0
    """Calls waiting in the queue."""
    places: int = 0
    """Places the keeper keeps (each runs a worker or waits out its backoff); 0 when no worker
    runs or will start (the restart policy stopped restarting, or idle workers retired)."""
    starts: int = 0
    """Workers started (first starts, restarts, scale-ups, replacements)."""
    exits: dict[str, int] = msgspec.field(default_factory=dict)
    """Why workers ended, by exit reason (``stopped`` excluded)."""
    last_exit: WorkerExit | None = None
    """The last worker that ended by its own fault (not stopped, retired or recycled)."""
    published: SidecarFacts | None = None
    """The facts last told to the catalog (None before the first)."""


def worker_row(w: Worker, now: float) -> WorkerStatus:
    """``w``'s row in the sidecar's status (``now``: trio time)."""
    return WorkerStatus(
        pid=w.pid or 0,
        state=w.state,
        inflight=w.inflight,
        calls=w.calls_issued,
        uptimeMs=round((now - w.started_at) * 1000.0, 1),
        startedBy=w.started_by,
        startMs=(
            round((w.ready_at - w.started_at) * 1000.0, 1) if w.ready_at is not None else None
        ),
    )


def sidecar_status(config: SidecarConfig, s: PoolStatistics) -> SidecarStatus:
    """The sidecar's row in ``catalog.sidecars`` and ``toolhost status``: the runtime the
    catalog was last told (``stopped``, or ``backoff`` while a replacement waits and the
    sidecar is not ready), its tools, workers, queue and last exit."""
    facts = s.published or sidecar_facts(s)
    state: Any = facts.runtime
    if s.stopped:
        state = "stopped"
    elif s.next_restart_ms is not None and facts.runtime != "ready":
        state = "backoff"
    ex = s.last_exit
    return SidecarStatus(
        id=s.sidecar,
        protocol=config.protocol,
        mode=config.mode,
        enabled=config.enabled,
        manifest="valid",
        runtime=state,
        tools=sorted(set(s.declared_tools) | set(s.announced or ())),
        workers=list(s.workers),
        queued=s.queued,
        restarts=s.restarts,
        lastExitCode=ex.exit_code if ex else None,
        lastExitReason=(f"{ex.reason}: {ex.message}" if ex else None),
        nextRestartMs=facts.details.nextRestartMs,
    )
