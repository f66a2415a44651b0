"""What a host adds around its pools to account for and contain them: the accounting, the call
quotas, the host-wide spawn and restart guard, and the sampler that measures and enforces
resource quotas (docs/quotas-and-limits.md).

# Strategy: one object owned by the host, configured from the registry at start and on every
# reload, whose background tasks (quota timer and state file, sampler) run in the host's
# nursery. The host calls it on the call path only through :attr:`quotas` (admit/release) and
# :meth:`record`, both O(1).
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
from supervisor.registry.catalog import Catalog
from supervisor.registry.load import Registry
from supervisor.registry.plan import Plan


class Safeguards:
    """Accounting, quotas, guard and sampler of one host.

    Args:
        catalog: The host's catalog (quota-limited flags go there).
        changed: Publishes changed descriptors.
        pools: Returns the host's pools now.
    """

    def __init__(
        self,
        catalog: Catalog,
        changed: Callable[[list[Descriptor]], None],
        pools: Callable[[], dict[str, Pool]],
    ) -> None:
        self.catalog = catalog
        self.accounting = Accounting()
        self.guard = HostGuard()
        self.quotas = Quotas(catalog, changed)
        self.quotas.latency_hint = self._latency_hint
        self.sampler = Sampler(self.accounting, pools)
        self._pools = pools

    def configure(self, registry: Registry, plan: Plan, *, first: bool = False) -> None:
        """Apply the registry's ``host`` settings and every quota (start and reload)."""
        hcfg = registry.host
        self.guard.configure(
            hcfg.max_concurrent_spawns, hcfg.max_restarts_per_second, hcfg.restart_burst
        )
        self.sampler.interval_s = hcfg.stats_interval_ms / 1000.0
        self.accounting.interval_ms = hcfg.stats_interval_ms
        if first and hcfg.quota_state:
            self.quotas.state_path = registry.path(hcfg.quota_state)
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
        return self.accounting.snapshot(self._pools(), self.guard, self.quotas, uptime_ms=uptime_ms)

    def _latency_hint(self, tool: str) -> float:
        counts = self.accounting.tools.get(tool)
        if counts is None or not counts.latency.count:
            return 100.0
        return counts.latency.quantile(0.5)
