"""What the host's sidecars use and may use: accounting, call quotas, spawn guard, sampler.

# Strategy: the accounting, the call quotas, the host-wide spawn and restart guard, and the
# sampler that measures and enforces resource quotas (docs/quotas-and-limits.md) are one object
# owned by the host, built with the catalog, the publisher of catalog
# changes and the live pools, configured from the registry at start and on every reload, whose
# background tasks (quota timer and state file, sampler) run in the host's nursery. The call
# path reaches it only through :attr:`Usage.quotas` (admit/release) and :meth:`Usage.record`,
# both O(1); ``system.stats`` reads :meth:`Usage.stats`.
"""

from __future__ import annotations

from collections.abc import Callable

import msgspec
import trio

from supervisor.calls.quotas import Quotas
from supervisor.contracts.envelope import Envelope
from supervisor.contracts.snapshot import Descriptor
from supervisor.contracts.stats import StatsResult
from supervisor.host.accounting import Accounting
from supervisor.host.sampler import Sampler
from supervisor.pools.guard import HostGuard
from supervisor.pools.pool import Pool
from supervisor.registry.catalog import CatalogState
from supervisor.registry.load import Registry
from supervisor.registry.plan import Plan


class Usage:
    """Accounting, quotas, guard and sampler of one host.

    Args:
        catalog: The host's catalog (quota-limited flags go there).
        changed: Publishes changed descriptors.
        pools: Returns the host's pools now.
        quota_state: The ``callsPerDay`` state file (``host.quotaState``, read once at start;
            None: counts live in memory only).
    """

    def __init__(
        self,
        catalog: CatalogState,
        changed: Callable[[list[Descriptor]], None],
        pools: Callable[[], dict[str, Pool]],
        *,
        quota_state: str | None = None,
    ) -> None:
        self.catalog = catalog
        self.accounting = Accounting()
        self.guard = HostGuard()
        self.quotas = Quotas(catalog, changed, quota_state, latency_hint=self.latency_hint)
        self.sampler = Sampler(self.accounting, pools)
        self._pools = pools

    def configure(self, registry: Registry, plan: Plan) -> None:
        """Apply the registry's ``host`` settings and every quota (start and reload)."""
        hcfg = registry.host
        self.guard.configure(
            hcfg.max_concurrent_spawns, hcfg.max_restarts_per_second, hcfg.restart_burst
        )
        self.sampler.interval_s = hcfg.stats_interval_ms / 1000.0
        self.accounting.interval_ms = hcfg.stats_interval_ms
        self.quotas.configure(plan)

    async def start(self, nursery: trio.Nursery) -> None:
        """Start the background tasks in the host's nursery."""
        await nursery.start(self.quotas.run)
        await nursery.start(self.sampler.run)

    def record(self, tool: str, input_raw: msgspec.Raw, env: Envelope) -> None:
        """Account one envelope (tools nobody knows are not counted: names are unbounded)."""
        if env.error is None or env.error.code != "unknown-tool":
            self.accounting.record(tool, self.catalog.owner(tool), env, len(input_raw))

    def stats(self, uptime_ms: float) -> StatsResult:
        """Accounting per sidecar, tool and worker (``system.stats``)."""
        return self.accounting.snapshot(self._pools(), self.guard, self.quotas, uptime_ms=uptime_ms)

    def latency_hint(self, tool: str) -> float:
        """A tool's median latency in ms (100 before any call): the ``retryAfterMs`` of a
        ``maxConcurrent`` refusal."""
        counts = self.accounting.tools.get(tool)
        if counts is None or not counts.latency.count:
            return 100.0
        return counts.latency.quantile(0.5)
