"""The keeper of one pool: starts its workers from the child spec and restarts them by the policy.

# Strategy: like OTP's ``supervisor.erl``, and nothing more. The keeper holds *places*: each
# is a task that builds a worker from the child spec (a fresh launch spec, the factory, the log
# taps), runs it to its end (holding a host-wide start slot until it is ready), asks the pure
# ``policy/restart.py`` what follows, sleeps the backoff (cut short by an operator restart,
# paced by the host's restart budget) and starts the next one. A worker that was ``retired``
# or ``stopped`` frees its place; a ``recycled`` one is replaced at once, uncharged. What the
# restart policy concluded decides whether calls may wait for a replacement (the restart window
# of PROTOCOL 4): past the intensity, or when a replacement of a sidecar that was ready cannot
# start, the calls waiting in the pool's queue are refused and new ones are refused by
# :meth:`Keeper.refusal`, which the pool's dispatch asks before it takes each call. What ready
# workers do (pings, idle retire) and when a place is added (scale-up) is the monitor's.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from functools import partial
from typing import Any, Protocol

import trio

from supervisor.calls.call import CallOutcome
from supervisor.policy import restart as restart_policy
from supervisor.pools.spec import ChildSpec, Collaborators
from supervisor.telemetry.events import PoolView, chain_taps
from supervisor.workers.base import Worker, WorkerExit, WorkerHooks


class Owner(WorkerHooks, PoolView, Protocol):
    """The pool a keeper works for: its workers report to it; the event bus reads it."""


def _ms() -> float:
    return trio.current_time() * 1000.0


class Keeper:
    """Starts and restarts the workers of one sidecar.

    Args:
        spec: The child spec: what to start and the restart policy.
        links: The pool's collaborators (start slots, metering, log taps, jitter).
        owner: The pool: every worker's hooks.
        refuse: Refuses every call waiting in the pool's queue with an outcome.
        changed: Called whenever what the keeper knows changed (the pool publishes).
    """

    def __init__(
        self,
        spec: ChildSpec,
        links: Collaborators,
        owner: Owner,
        *,
        refuse: Callable[[CallOutcome], None],
        changed: Callable[[], None],
    ) -> None:
        self.sidecar = spec.sidecar
        self.config = spec.config
        self._spec = spec
        self._links = links
        self._owner = owner
        self._refuse = refuse
        self._changed = changed
        self.workers: list[Worker] = []
        """Live workers, in start order (the pool dispatches to this very list)."""
        self.restart_state = restart_policy.RestartState()
        self.last_exit: WorkerExit | None = None
        """The last worker that ended by its own fault (not stopped, retired or recycled)."""
        self.last_stderr = ""
        self.ever_ready = False
        self.gave_up = False
        self.start_failing = False
        """The last worker ended before ready; cleared by the next ready (PROTOCOL 4)."""
        self.stopped = False
        self.next_restart_at: float | None = None
        """When the backoff ends (ms, trio clock), while a place waits one out."""
        self.starts = 0
        """Workers started (first starts, restarts, scale-ups, replacements)."""
        self.exits: Counter[str] = Counter()
        """Why workers ended, by exit reason (``stopped`` excluded)."""
        self.places = 0
        """Places kept: each runs a worker or waits out its backoff."""
        self._index = 0
        self._kick = trio.Event()
        self._nursery: trio.Nursery | None = None

    # lifecycle ---------------------------------------------------------------------------

    def start(self, nursery: trio.Nursery) -> None:
        """Keep ``pool.min`` workers (at least one at first, to verify the sidecar starts), the
        places' tasks in ``nursery`` (the pool's: they end with it)."""
        self._nursery = nursery
        for _ in range(max(1, self.config.pool.min)):
            self.add()

    @property
    def running(self) -> bool:
        """:meth:`start` was called: places can be added."""
        return self._nursery is not None

    def add(self) -> None:
        """One more place (a worker and its restarts)."""
        assert self._nursery is not None
        self.places += 1
        self._nursery.start_soon(self._keep)

    def halt(self) -> None:
        """Start no worker any more (the pool stops); a place in backoff ends now."""
        self.stopped = True
        self._kick.set()

    async def stop(self, drain_s: float) -> None:
        """Stop every worker, letting running calls end within ``drain_s``."""
        async with trio.open_nursery() as nursery:
            for w in list(self.workers):
                nursery.start_soon(partial(w.stop, "stopped", drain_s=drain_s))

    async def restart(self) -> None:
        """Replace every worker now (operator action), also one in backoff or past the restart
        intensity; the restart budget is not charged."""
        self.gave_up = False
        self.restart_state = restart_policy.RestartState(total=self.restart_state.total)
        self._kick.set()  # places sleeping a backoff start their worker now
        self._kick = trio.Event()
        old = list(self.workers)
        async with trio.open_nursery() as nursery:
            for w in old:
                nursery.start_soon(partial(w.stop, "recycled", drain_s=0.0))
        if self.places == 0:
            self.add()

    def recycle(self, worker: Worker) -> None:
        """``worker`` served its ``maxCallsPerWorker``: drain it; its place starts a new one."""
        worker.refuse_new_calls()
        assert self._nursery is not None
        self._nursery.start_soon(
            lambda: worker.stop("recycled", drain_s=self.config.timeout_ms / 1000.0)
        )

    # what workers tell -------------------------------------------------------------------

    def ready(self, worker: Worker) -> None:
        """``worker`` is ready: its start slot is free and the sidecar starts."""
        guard = self._links.guard
        if guard is not None:
            guard.release(worker)
        metering = self._links.metering
        if metering is not None:
            metering.worker_started(self.sidecar, worker.started_by)
        self.ever_ready = True
        self.start_failing = False
        if self.gave_up:
            self.gave_up = False

    def stable(self) -> None:
        """A worker stayed ready for ``restart.resetAfterMs``: the backoff starts over."""
        self.restart_state = restart_policy.on_stable(self.config.restart, self.restart_state)

    # a place -----------------------------------------------------------------------------

    async def _keep(self) -> None:
        restart = False
        try:
            while not self.stopped:
                worker = self._start()
                ex = await self._run_worker(worker, restart)
                self.workers.remove(worker)
                metering = self._links.metering
                if metering is not None:
                    metering.worker_exited(self.sidecar, ex.reason)
                if ex.reason != "stopped":
                    self.exits[ex.reason] += 1
                if ex.stderr_tail:
                    self.last_stderr = ex.stderr_tail
                if self.stopped or ex.reason == "stopped":
                    return
                if ex.reason == "retired":
                    return
                if ex.reason == "recycled":
                    continue
                self.last_exit = ex
                self.start_failing = not ex.was_ready
                decision, self.restart_state = restart_policy.on_exit(
                    self.config.restart,
                    self.restart_state,
                    now=_ms(),
                    uptime_ms=ex.uptime_ms,
                    clean=ex.exit_code == 0,
                    rng=self._links.rng,
                )
                if decision.action == "stop":
                    if not any(w.state in ("ready", "starting") for w in self.workers):
                        self.gave_up = True
                        self._refuse_queue(ex)
                    return
                if decision.action == "give-up":
                    self.gave_up = True
                    self._refuse_queue(ex)
                elif self.start_failing and self.ever_ready:
                    # The restart window covers starting a replacement, not a sidecar that
                    # cannot start: what waited for this one is answered now.
                    self._refuse_queue(ex)
                self.next_restart_at = _ms() + decision.delay_ms
                self._changed()
                kick = self._kick
                with trio.move_on_after(decision.delay_ms / 1000.0):
                    await kick.wait()
                guard = self._links.guard
                if guard is not None and not kick.is_set():
                    await guard.restart_token()
                self.next_restart_at = None
                restart = True
        finally:
            self.places -= 1
            self._changed()

    def _start(self) -> Worker:
        """Build the next worker from the child spec, its stderr tapped, and count it."""
        links = self._links
        self._index += 1
        worker = self._spec.factory(self._spec.launch(), self._owner, self._index)
        if links.stderr_lines is not None:
            worker.stderr.tap = links.stderr_lines.tap(self.sidecar, partial(_log_context, worker))
        if links.events is not None:  # keeps a tap already set (JSON logs)
            worker.stderr.tap = chain_taps(
                worker.stderr.tap, links.events.stderr_tap(self._owner, worker)
            )
        self.workers.append(worker)
        self.starts += 1
        self._changed()
        return worker

    async def _run_worker(self, worker: Worker, restart: bool) -> WorkerExit:
        """Run ``worker`` to its end, holding a host-wide start slot until it is ready."""
        guard = self._links.guard
        if guard is None:
            return await worker.run()
        try:
            await guard.start_slot(worker, self.sidecar, restart=restart)
            if worker.state != "starting":  # stopped or recycled while it waited for the slot
                reason: Any = "stopped" if self.stopped else "recycled"
                return WorkerExit(reason=reason, message="stopped before it started")
            return await worker.run()
        finally:
            guard.release(worker)

    # refusals ----------------------------------------------------------------------------

    def refusal(self) -> CallOutcome | None:
        """Why the sidecar takes no call now (stopping, cannot start, gave up), or None."""
        if self.stopped:
            return CallOutcome(
                ok=False, code="shutting-down", error=f"sidecar {self.sidecar} is stopping"
            )
        failing = self.start_failing and self.ever_ready
        if failing and not any(w.state == "ready" for w in self.workers):
            return self._down("cannot start")
        if self.gave_up and not any(w.state in ("ready", "starting") for w in self.workers):
            return self._down("has failed")
        return None

    def _refuse_queue(self, ex: WorkerExit) -> None:
        """Past the restart intensity, or a replacement could not start: the calls waiting
        for a replacement are refused."""
        if any(w.state == "ready" for w in self.workers):
            return
        self._refuse(
            CallOutcome(
                ok=False,
                code="unavailable",
                error=f"sidecar {self.sidecar} is failing: {ex.message}",
                stderr=ex.stderr_tail[-4096:] or None,
                exit_code=ex.exit_code,
            )
        )

    def _down(self, what: str) -> CallOutcome:
        """``unavailable`` for a call the sidecar cannot take, with its last exit attached."""
        ex = self.last_exit
        return CallOutcome(
            ok=False,
            code="unavailable",
            error=f"sidecar {self.sidecar} {what}" + (f": {ex.message}" if ex is not None else ""),
            exit_code=ex.exit_code if ex else None,
            stderr=(ex.stderr_tail[-4096:] or None) if ex else None,
        )


def _log_context(worker: Worker) -> dict[str, Any]:
    """What a forwarded stderr line of ``worker`` is tagged with (JSON logs)."""
    fields: dict[str, Any] = {"pid": worker.pid}
    call = worker.sole_call()
    if call is not None:
        fields["tool"] = call.tool
        fields["callId"] = call.id
        ids = call.trace.log_ids() if call.trace is not None else None
        if ids is not None:
            fields["trace_id"], fields["span_id"] = ids
    return fields
