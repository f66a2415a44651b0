"""The calls in flight on one worker: the :class:`SlotTable` every kind of worker composes.

# Strategy: a call attempt on a worker is a :class:`CallSlot` (an id, the call, and an event made
# only when somebody waits for the slot's end) in one dict: no task per message, no lock. The
# table is the one place a worker's call bookkeeping lives, whatever carries the calls (lines on
# a pipe, HTTP POSTs, a process per call): a call starts on a slot (:meth:`SlotTable.add`) and
# ends with the outcome its protocol parser made (:meth:`~SlotTable.answer`); a deadline or a
# cancel abandons it (:meth:`~SlotTable.abandon`: its answer will not end the call), and the slot
# is freed when the peer answers or at once (:meth:`~SlotTable.release`) for peers that need not
# answer a cancel; a worker that dies fails every call still on it (:meth:`~SlotTable.fail_all`).
# Every freed slot tells the pool on the same tick (``on_capacity``), so a queued call starts there
# at once. Requests that are not calls (pings, the MCP handshake) wait for their answer by key
# (:meth:`~SlotTable.wait_for`, :meth:`~SlotTable.resolve`) and are woken empty when the worker
# ends.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Protocol

import msgspec
import trio

from supervisor.calls.call import Call
from supervisor.protocols.outcome import CallOutcome

log = logging.getLogger("toolhost.workers")


class CallSlot:
    """One attempt of a call in flight on a worker: its slot id and how it ended.

    An abandoned slot (deadline, cancel) no longer ends its call; the worker may still wait for
    the peer to let go of it (``done``) before the slot is free.
    """

    __slots__ = ("_done", "abandoned", "call", "finished", "id")

    def __init__(self, slot_id: int, call: Call) -> None:
        self.id = slot_id
        self.call = call
        self.abandoned = False
        self.finished = False
        self._done: trio.Event | None = None

    def finish(self) -> None:
        self.finished = True
        if self._done is not None:
            self._done.set()

    async def wait(self) -> None:
        """Until the peer answered or the worker ended."""
        if self.finished:
            return
        if self._done is None:
            self._done = trio.Event()
        await self._done.wait()


class CapacityListener(Protocol):
    """Who hears that a slot of a worker freed (the worker's pool)."""

    def on_capacity(self, worker: Any) -> None: ...


class SlotTable:
    """The calls in flight on one worker, and the requests it waits answers for.

    Args:
        owner: The worker whose calls these are.
        listener: Told ``on_capacity(owner)`` each time a slot frees (the pool hands the next
            queued call over).
    """

    __slots__ = (
        "_answered",
        "_idle",
        "_listener",
        "_owner",
        "_waiters",
        "explain",
        "last_active",
        "slots",
        "started",
    )

    def __init__(self, owner: object, listener: CapacityListener) -> None:
        self.slots: dict[int, CallSlot] = {}
        """Slots by id: calls running, and abandoned ones the peer has not let go of."""
        self.started = 0
        """Attempts started over the worker's life."""
        self.last_active = 0.0
        """When a call last started or ended (trio clock)."""
        self._owner = owner
        self._listener = listener
        self._waiters: dict[Any, list[Any]] = {}
        self._answered: dict[Any, Callable[[Any], None]] = {}
        self._idle = trio.Event()
        self.explain: Callable[[Call, CallOutcome], None] | None = None
        """Told of every failed outcome before its call ends (a confined worker adds which
        grant would allow what its walls refused, PROTOCOL 7)."""

    # calls -------------------------------------------------------------------------------

    def add(self, slot_id: int, call: Call) -> CallSlot:
        """Put ``call`` on a new slot (the caller sends it)."""
        slot = CallSlot(slot_id, call)
        self.slots[slot_id] = slot
        call.slot = slot
        self.started += 1
        self.last_active = trio.current_time()
        return slot

    def answer(self, slot_id: int, outcome: CallOutcome) -> None:
        """Slot ``slot_id`` ended with ``outcome``: end its call (unless abandoned) and free
        the slot. An unknown or already freed id is ignored."""
        slot = self.slots.pop(slot_id, None)
        if slot is None:
            return
        slot.finish()
        self.last_active = trio.current_time()
        if not self.slots:
            self._idle.set()
        if not slot.abandoned:
            if not outcome.ok and self.explain is not None:
                self.explain(slot.call, outcome)
            slot.call.ended(outcome)
        self._listener.on_capacity(self._owner)

    def progress(self, slot_id: int, data: msgspec.Raw) -> None:
        """Progress of slot ``slot_id``'s call (dropped once it is abandoned or ended)."""
        slot = self.slots.get(slot_id)
        if slot is not None and not slot.abandoned:
            slot.call.progress(data)

    def call_on(self, slot_id: int) -> Call | None:
        """The call running on slot ``slot_id`` (None: no such slot, or it was abandoned)."""
        slot = self.slots.get(slot_id)
        return None if slot is None or slot.abandoned else slot.call

    def abandon(self, call: Call) -> CallSlot | None:
        """Mark ``call``'s slot abandoned: its answer will not end the call. Returns the slot,
        or None when there is nothing to abandon (ended, or abandoned before)."""
        slot = call.slot
        if isinstance(slot, CallSlot) and not slot.finished and not slot.abandoned:
            slot.abandoned = True
            return slot
        return None

    def release(self, slot: CallSlot) -> None:
        """Free an abandoned slot now, without waiting for the peer (it need not answer)."""
        self.slots.pop(slot.id, None)
        slot.finish()
        if not self.slots:
            self._idle.set()
        self._listener.on_capacity(self._owner)

    def fail_all(self, outcome: Callable[[Call], CallOutcome]) -> None:
        """The worker ended: every call still on it ends with ``outcome(call)``, every waiter
        wakes empty."""
        slots, self.slots = self.slots, {}
        for slot in slots.values():
            if slot.finished:
                continue
            slot.finish()
            if not slot.abandoned:
                slot.call.ended(outcome(slot.call))
        for waiter in self._waiters.values():
            waiter[0].set()
        self._waiters.clear()
        answered, self._answered = self._answered, {}
        for fn in answered.values():
            _deliver(fn, None)
        self._idle.set()

    # what is running ---------------------------------------------------------------------

    def running(self) -> int:
        """Calls whose callers still wait (abandoned slots not counted)."""
        return sum(1 for slot in self.slots.values() if not slot.abandoned)

    def live(self) -> list[CallSlot]:
        """The slots whose callers still wait."""
        return [slot for slot in self.slots.values() if not slot.abandoned]

    def sole_call(self) -> Call | None:
        """The one call on this worker, if exactly one is and it was not abandoned."""
        if len(self.slots) != 1:
            return None
        slot = next(iter(self.slots.values()))
        return None if slot.abandoned else slot.call

    async def drained(self) -> None:
        """Until no slot is in use (at once when none is)."""
        if not self.slots:
            return
        self._idle = trio.Event()
        await self._idle.wait()

    # requests that are not calls ---------------------------------------------------------

    async def wait_for(self, key: Any, timeout_s: float) -> Any:
        """Wait up to ``timeout_s`` for :meth:`resolve` of ``key`` (its request was just sent).

        Returns the resolved value, or None on timeout or when the worker ends.
        """
        waiter: list[Any] = [trio.Event(), None]
        self._waiters[key] = waiter
        try:
            with trio.move_on_after(timeout_s):
                await waiter[0].wait()
        finally:
            self._waiters.pop(key, None)
        return waiter[1]

    def when_resolved(self, key: Any, fn: Callable[[Any], None]) -> None:
        """Call ``fn`` with :meth:`resolve`'s value of ``key`` (None when the worker ends), from
        the task that resolves it: no task waits (:meth:`forget` drops it)."""
        self._answered[key] = fn

    def forget(self, key: Any) -> None:
        """No more interest in ``key``'s answer (a timeout or a cancel)."""
        self._answered.pop(key, None)

    def resolve(self, key: Any, value: Any) -> None:
        """The answer to request ``key`` came (ignored when nobody waits for it)."""
        fn = self._answered.pop(key, None)
        if fn is not None:
            _deliver(fn, value)
            return
        waiter = self._waiters.get(key)
        if waiter is not None:
            waiter[1] = value
            waiter[0].set()


def _deliver(fn: Callable[[Any], None], value: Any) -> None:
    """Hand an answer over from the worker's reader, which must go on whatever the receiver
    does with it."""
    try:
        fn(value)
    except Exception:
        log.exception("delivering a worker's answer failed")
