"""Every change of the host's catalog, published: ``catalog.changed`` events and change pulses.

# Strategy: the catalog (``registry/catalog.py``) is pure state; every writer of it goes through
# this feed (the plan at start and reload, a pool's facts, the package manager's upgrade state,
# a quota window), which hands the changed descriptors and the names that left to every
# subscriber's bounded channel (a subscriber that falls behind is dropped and may subscribe
# again), remembers the provider-safe name (``file__hash``) of each tool it published so a
# kernel may call a tool by it, and wakes whoever waits in-process for the next change of the
# catalog or of any pool (:meth:`CatalogFeed.wait_change`: tests, the CLI's watchers, the
# package manager's verdicts). Nothing here is on the call path.
"""

from __future__ import annotations

from collections.abc import Mapping

import trio

from supervisor.contracts.rpc import CatalogChanged
from supervisor.contracts.snapshot import Descriptor, Reason, UpgradeField
from supervisor.policy.naming import provider_name
from supervisor.registry.catalog import CatalogState, SidecarFacts
from supervisor.registry.plan import Plan

SUBSCRIBER_BUFFER = 256


class CatalogFeed:
    """The writer of one host's catalog that publishes each change.

    Args:
        catalog: The host's catalog.
    """

    def __init__(self, catalog: CatalogState) -> None:
        self.catalog = catalog
        self._subscribers: set[trio.MemorySendChannel[CatalogChanged | None]] = set()
        self._aliases: dict[str, str] = {}
        self._pulse = trio.Event()

    # writing the catalog -------------------------------------------------------------------

    def load(
        self,
        plan: Plan,
        *,
        allow_degraded: bool | None = None,
        reset: set[str] | frozenset[str] = frozenset(),
    ) -> None:
        """Load ``plan`` into the catalog (start, reload) and publish what changed."""
        self.publish(self.catalog.load(plan, allow_degraded=allow_degraded, reset=reset))

    def sidecar_facts(self, sidecar: str, facts: SidecarFacts) -> None:
        """A pool published what it knows of its sidecar now."""
        catalog = self.catalog
        revision = catalog.revision
        changed = catalog.update_sidecar(sidecar, facts)
        if not changed and catalog.revision != revision:
            # Only removals (a tool the sidecar stopped announcing): tell subscribers to re-read.
            self.publish([], force=True)
        else:
            self.publish(changed)

    def set_upgrade(
        self, sidecar: str, state: UpgradeField | None, reason: Reason | None = None
    ) -> None:
        """Show the package manager's ``upgrade`` state for ``sidecar`` (None: the registry's)."""
        self.publish(self.catalog.set_upgrade(sidecar, state, reason))

    def set_denied(self, denied: Mapping[str, Reason]) -> None:
        """Show these sidecars' tools ``sandbox: denied`` with their reasons (PROTOCOL 7:
        a confinement ``required`` cannot meet); every other sidecar's as the registry says."""
        self.publish(self.catalog.set_denied(denied))

    # publishing ----------------------------------------------------------------------------

    def publish(self, changed: list[Descriptor], *, force: bool = False) -> None:
        """Hand ``changed`` (and the names that left) to every subscriber and wake watchers;
        nothing when nothing changed, unless ``force``."""
        removed = self.catalog.take_removed()
        if not changed and not removed and not force:
            return
        self.pulse()
        for d in changed:
            alias = provider_name(d.name)
            if alias != d.name:
                self._aliases[alias] = d.name
        event = CatalogChanged(revision=self.catalog.revision, tools=changed, removed=removed)
        for ch in list(self._subscribers):
            try:
                ch.send_nowait(event)
            except trio.WouldBlock:
                # A subscriber that cannot keep up is dropped; it may subscribe again.
                self._subscribers.discard(ch)
                ch.close()
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                self._subscribers.discard(ch)

    def subscribe(self) -> trio.MemoryReceiveChannel[CatalogChanged | None]:
        """A channel of ``catalog.changed`` events (closed if the reader falls behind)."""
        send, recv = trio.open_memory_channel[CatalogChanged | None](SUBSCRIBER_BUFFER)
        self._subscribers.add(send)
        return recv

    def close(self) -> None:
        """The host stopped: every subscription ends."""
        for ch in list(self._subscribers):
            ch.close()
        self._subscribers.clear()

    def resolve_name(self, name: str) -> str:
        """Map a provider-safe name (``file__hash``) back to the tool name (``file.hash``)."""
        if self.catalog.get(name) is not None:
            return name
        return self._aliases.get(name, name)

    # pulses --------------------------------------------------------------------------------

    def pulse(self) -> None:
        """Something changed (the catalog, a pool, the zygote): wake every :meth:`wait_change`."""
        self._pulse.set()
        self._pulse = trio.Event()

    async def wait_change(self) -> None:
        """Return at the next state change of any pool or of the catalog (for tests and tools
        that watch the host in-process)."""
        await self._pulse.wait()
