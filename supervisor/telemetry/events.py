"""The host's operator event bus: ``events.subscribe`` (PROTOCOL 6) for consoles and dashboards.

# Strategy: the bus keeps, per topic (``workers``, ``calls``, ``logs``), the list of current
# subscriptions. Every source checks that list first and does nothing when it is empty, so the
# bus costs nothing while nobody watches: the call path is not even called (the bus hooks
# itself into the call engine, through the ``on_calls`` it is built with, only while someone
# subscribes to ``calls``), a pool's
# state change is one empty-list check, and a stderr chunk is one more. With subscribers, an
# event is a small Struct appended to each subscription's own bounded deque (no task, no
# channel, no copy per subscriber); a subscription over its bound counts what it loses instead
# of queueing it, and its reader gets ``events.dropped {count}`` in their place. So a console
# that stops reading costs the host a fixed amount of memory, never more.
#
# Sources: the one call path (``CallEngine.begin`` and ``Call._finish``), the pools' state
# changes (``Pool._publish``: workers are diffed against what was last told, so every start,
# ready, exit and published state change is one ``worker.changed``), and the stderr ring of
# every worker (cut into lines, secrets masked by the pool's redactor, lines cut at 2 KiB).
# The bus sits below the call path and the workers and imports neither: it reads a call as an
# :class:`EventCall`, a worker as an :class:`EventWorker`, a pool as a :class:`PoolView`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Collection, Iterable, Sequence
from typing import Any, Literal, Protocol

import trio

from supervisor.contracts.envelope import Envelope
from supervisor.contracts.events import (
    TOPICS,
    CallEnded,
    CallStarted,
    EventsDropped,
    LogLine,
    Topic,
    WorkerChanged,
)
from supervisor.contracts.snapshot import WorkerStatus


class EventCall(Protocol):
    """What the bus reads of a call (``supervisor.calls.call.Call``)."""

    @property
    def id(self) -> int: ...

    @property
    def key(self) -> Any: ...

    @property
    def tool(self) -> str: ...

    @property
    def sidecar(self) -> str: ...


class EventWorker(Protocol):
    """What the bus reads of a worker (``supervisor.workers.base.Worker``)."""

    @property
    def pid(self) -> int | None: ...

    @property
    def state(self) -> str: ...

    @property
    def inflight(self) -> int: ...

    @property
    def calls_issued(self) -> int: ...

    @property
    def started_at(self) -> float: ...

    @property
    def ready_at(self) -> float | None: ...

    @property
    def started_by(self) -> Literal["zygote", "exec"]: ...


class PoolView(Protocol):
    """What the bus reads of a pool (``pools/pool.py`` imports this module, not the reverse)."""

    @property
    def sidecar(self) -> str: ...

    @property
    def workers(self) -> Sequence[EventWorker]: ...

    @property
    def redact(self) -> Callable[[str], str] | None: ...


QUEUE_LIMIT = 4096
"""Events one subscription may hold before it starts dropping (a few MiB at worst): room for
one flush interval of a host answering tens of thousands of calls a second."""
LINE_LIMIT = 2048
"""A stderr line longer than this is cut (and a line with no newline yet is sent cut)."""
TEXT_LIMIT = 1024
"""Error messages and stderr tails in ``call.ended`` keep this many characters."""

Event = tuple[str, Any]


class Subscription:
    """One subscriber's events, bounded: past ``limit`` it counts what it loses.

    Args:
        topics: What it asked for.
        sidecar: Only this sidecar's events (None: every sidecar).
        limit: Events held at most.
    """

    __slots__ = ("_queue", "_wake", "closed", "dropped", "limit", "sidecar", "topics")

    def __init__(self, topics: Collection[Topic], sidecar: str | None, limit: int) -> None:
        self.topics = frozenset(topics)
        self.sidecar = sidecar
        self.limit = limit
        self._queue: deque[Event] = deque()
        self.dropped = 0
        self._wake: trio.Event | None = None
        self.closed = False

    @property
    def queued(self) -> int:
        return len(self._queue)

    def push(self, name: str, data: Any) -> None:
        """Queue one event, or count it as dropped when the subscriber is ``limit`` behind."""
        if len(self._queue) >= self.limit:
            self.dropped += 1
        else:
            self._queue.append((name, data))
        wake = self._wake
        if wake is not None:
            self._wake = None
            wake.set()

    async def take(self) -> list[Event]:
        """Every queued event (waits for one), after ``events.dropped`` if events were lost."""
        while not self._queue and not self.dropped:
            if self.closed:
                return []
            self._wake = wake = trio.Event()
            await wake.wait()
        items = list(self._queue)
        self._queue.clear()
        if self.dropped:
            # First, not after the queue: a reader that is always behind must still hear it.
            items.insert(0, ("events.dropped", EventsDropped(count=self.dropped)))
            self.dropped = 0
        return items

    def put_back(self, items: list[Event]) -> None:
        """Return events :meth:`take` gave out but the reader could not send yet (its
        connection's backlog filled): they go first next time, their drop count too."""
        for name, data in reversed(items):
            if name == "events.dropped":
                self.dropped += data.count
            else:
                self._queue.appendleft((name, data))

    def close(self) -> None:
        self.closed = True
        wake = self._wake
        if wake is not None:
            self._wake = None
            wake.set()


class EventBus:
    """Operator events of one host.

    Args:
        pools: The host's running pools now (to know the workers a new subscriber starts from).
        on_calls: Hooks the bus into the call path (None: unhooks it); called when the first
            ``calls`` subscriber comes and when the last one leaves (``CallEngine.watch``).
    """

    def __init__(
        self,
        pools: Callable[[], Iterable[PoolView]] = lambda: (),
        on_calls: Callable[[EventBus | None], None] = lambda bus: None,
    ) -> None:
        self._pools = pools
        self._subs: dict[Topic, list[Subscription]] = {t: [] for t in TOPICS}
        self._seen: dict[str, dict[int, tuple[int | None, str]]] = {}
        self.on_calls = on_calls

    def subscribers(self, topic: Topic) -> int:
        return len(self._subs[topic])

    def subscribe(
        self, topics: Collection[Topic], sidecar: str | None = None, *, limit: int = QUEUE_LIMIT
    ) -> Subscription:
        """A new subscription to ``topics`` (of one ``sidecar``, or all)."""
        sub = Subscription(topics, sidecar, limit)
        if "workers" in sub.topics and not self._subs["workers"]:
            self._prime()
        if "calls" in sub.topics and not self._subs["calls"]:
            self.on_calls(self)
        for topic in sub.topics:
            self._subs[topic].append(sub)
        return sub

    def unsubscribe(self, sub: Subscription) -> None:
        """End ``sub`` (idempotent); the last ``calls`` subscriber unhooks the call path."""
        sub.close()
        for topic in sub.topics:
            subs = self._subs[topic]
            if sub in subs:
                subs.remove(sub)  # in place: taps hold these lists
                if topic == "calls" and not subs:
                    self.on_calls(None)

    def _emit(self, topic: Topic, sidecar: str, name: str, data: Any) -> None:
        for sub in self._subs[topic]:
            if sub.sidecar is None or sub.sidecar == sidecar:
                sub.push(name, data)

    # calls ---------------------------------------------------------------------------------

    def call_started(self, call: EventCall) -> None:
        """A call went to its pool (``CallEngine.begin``)."""
        key = call.key
        rid = key[1] if isinstance(key, tuple) and len(key) == 2 else None
        self._emit(
            "calls",
            call.sidecar,
            "call.started",
            CallStarted(
                callId=call.id,
                tool=call.tool,
                sidecar=call.sidecar,
                requestId=rid if isinstance(rid, int | str) else None,
            ),
        )

    def call_ended(self, call: EventCall, env: Envelope) -> None:
        """A call's one envelope was made (``Call._finish``)."""
        err = env.error
        self._emit(
            "calls",
            call.sidecar,
            "call.ended",
            CallEnded(
                callId=call.id,
                tool=call.tool,
                sidecar=call.sidecar,
                status=env.status,
                durationMs=env.meta.durationMs,
                code=err.code if err is not None else None,
                message=err.message[:TEXT_LIMIT] if err is not None else None,
                stderr=err.stderr[-TEXT_LIMIT:] if err is not None and err.stderr else None,
                pid=env.meta.pid,
            ),
        )

    # workers -------------------------------------------------------------------------------

    def _prime(self) -> None:
        """Remember the workers as they are, so a new subscriber hears only changes."""
        self._seen = {
            pool.sidecar: {id(w): (w.pid, w.state) for w in pool.workers} for pool in self._pools()
        }

    def pool_changed(self, pool: PoolView) -> None:
        """A pool published a state change: one ``worker.changed`` per worker that changed."""
        if not self._subs["workers"]:
            return
        seen = self._seen.setdefault(pool.sidecar, {})
        now = trio.current_time()
        current: dict[int, tuple[int | None, str]] = {}
        for w in pool.workers:
            state = (w.pid, w.state)
            current[id(w)] = state
            if seen.get(id(w)) != state:
                self._emit(
                    "workers",
                    pool.sidecar,
                    "worker.changed",
                    WorkerChanged(sidecar=pool.sidecar, worker=worker_status(w, now)),
                )
        for key, (pid, _state) in seen.items():
            if key not in current:
                gone = WorkerStatus(pid=pid or 0, state="exited", startedBy="exec")
                self._emit(
                    "workers",
                    pool.sidecar,
                    "worker.changed",
                    WorkerChanged(sidecar=pool.sidecar, worker=gone),
                )
        self._seen[pool.sidecar] = current

    # logs ----------------------------------------------------------------------------------

    def stderr_tap(self, pool: PoolView, worker: EventWorker) -> Callable[[bytes], None]:
        """What a worker's stderr ring hands every chunk to: cut into ``log.line`` events."""
        subs = self._subs["logs"]
        buf = bytearray()
        sidecar = pool.sidecar

        def line(raw: bytes) -> None:
            text = raw.rstrip(b"\r").decode("utf-8", "replace")
            redact = pool.redact
            if redact is not None:
                text = redact(text)
            self._emit(
                "logs", sidecar, "log.line", LogLine(sidecar=sidecar, pid=worker.pid, line=text)
            )

        def feed(data: bytes) -> None:
            if not subs:
                if buf:
                    buf.clear()
                return
            buf.extend(data)
            start = 0
            while (nl := buf.find(b"\n", start)) >= 0:
                line(bytes(buf[start : min(nl, start + LINE_LIMIT)]))
                start = nl + 1
            del buf[:start]
            if len(buf) > LINE_LIMIT:
                line(bytes(buf[:LINE_LIMIT]))
                buf.clear()

        return feed


def chain_taps(
    first: Callable[[bytes], None] | None, second: Callable[[bytes], None]
) -> Callable[[bytes], None]:
    """One stderr tap that feeds ``first`` (when set) and then ``second``."""
    if first is None:
        return second

    def both(data: bytes) -> None:
        first(data)
        second(data)

    return both


def worker_status(w: EventWorker, now: float) -> WorkerStatus:
    """A worker's row (PROTOCOL 6), as ``capability.catalog.get`` shows it."""
    return WorkerStatus(
        pid=w.pid or 0,
        state=w.state,
        inflight=w.inflight,
        calls=w.calls_issued,
        uptimeMs=round((now - w.started_at) * 1000.0, 1) if w.started_at else 0.0,
        startedBy=w.started_by,
        startMs=(
            round((w.ready_at - w.started_at) * 1000.0, 1) if w.ready_at is not None else None
        ),
    )
