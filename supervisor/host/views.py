"""What a running host shows: the catalog snapshot, the sidecar statuses, health and stats.

# Strategy: read-only views over the parts the host owns (what it loaded, its catalog, its
# pools, its usage), built once with them and read live; nothing here changes state or awaits.
# The kernel protocol's reading methods (``capability.catalog.get``, ``system.health``,
# ``system.stats``, ``sidecar.logs``), the WebSocket's ``/healthz`` and the CLI read the host
# through this one object, never through the host. The host services read a sidecar's running
# configuration and a tool's manifest here too.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Literal

import msgspec
import trio

from supervisor.contracts.confine import ConfinementFacts, EgressStats
from supervisor.contracts.manifest import ToolManifest
from supervisor.contracts.registry import HostConfig, SidecarConfig
from supervisor.contracts.rpc import Catalog, HealthCounts, HealthResult, RegistryStatus
from supervisor.contracts.snapshot import Descriptor, SidecarStatus, UpgradeField, ZygoteStatus
from supervisor.contracts.stats import StatsResult
from supervisor.host import offer_lists
from supervisor.host.loading import Loaded
from supervisor.host.usage import Usage
from supervisor.pools.pool import Pool
from supervisor.registry.catalog import CatalogState, SidecarFacts
from supervisor.registry.plan import SidecarPlan


class HostViews:
    """Read-only views of one running host.

    Args:
        loaded: What the host runs from now (read live: a reload writes into it).
        catalog: The host's catalog.
        pools: The running pools by sidecar id (the live mapping).
        usage: Accounting, quotas and guard (``system.stats``).
        started_at: When the host started (``trio.current_time``), for uptimes.
        zygote: The zygote's status now (None: no zygote).
        confinement: A sidecar's confinement column from the facts read from its worker
            (``Confiner.label``; None: no column).
        egress: The egress proxy's bytes and connections per sidecar (``system.stats``).
        hints: The grants that would allow what a sidecar's text (its stderr) says its walls
            refused (``Confiner.hints``; ``sidecar.logs``).
    """

    def __init__(
        self,
        loaded: Loaded,
        catalog: CatalogState,
        pools: Mapping[str, Pool],
        usage: Usage,
        *,
        started_at: float,
        zygote: Callable[[], ZygoteStatus | None],
        confinement: Callable[[str, ConfinementFacts | None], str] | None = None,
        egress: Callable[[], dict[str, EgressStats]] | None = None,
        hints: Callable[[str, str], list[str]] | None = None,
    ) -> None:
        self.loaded = loaded
        self.catalog = catalog
        self.pools = pools
        self.usage = usage
        self.started_at = started_at
        self.zygote = zygote
        self.confinement = confinement
        self.egress = egress
        self.hints = hints

    # the kernel protocol's views -----------------------------------------------------------

    def snapshot(self) -> Catalog:
        """``capability.catalog.get``: descriptors, sidecar statuses, zygote, registry."""
        loaded = self.loaded
        return Catalog(
            revision=self.catalog.revision,
            tools=self.catalog.tools(),
            sidecars=self.sidecar_statuses(),
            zygote=self.zygote(),
            registry=RegistryStatus(
                files=list(loaded.registry.files),
                errors=[*loaded.registry.errors, *loaded.known.errors],
            ),
        )

    def sidecar_statuses(self) -> list[SidecarStatus]:
        """One status per planned sidecar, running or not, in id order."""
        out = []
        for sid, sp in sorted(self.loaded.plan.sidecars.items()):
            pool = self.pools.get(sid)
            if pool is not None:
                status = pool.status()
                if sp.entry.warnings:
                    status = msgspec.structs.replace(status, errors=list(sp.entry.warnings))
                shadowed = self.shadowed(sid, status.tools)
                if shadowed:
                    status = msgspec.structs.replace(status, shadowed=shadowed)
                if sp.announces:
                    # A folder's tools are what the catalog gives it: a multi-tool script's
                    # file name is no tool once the script listed its tools.
                    owned = sorted(d.name for d in self.catalog.tools() if d.sidecar == sid)
                    status = msgspec.structs.replace(status, tools=owned)
                if self.confinement is not None:
                    walls = pool.statistics().confinement
                    status = msgspec.structs.replace(
                        status, confinement=self.confinement(sid, walls)
                    )
                out.append(status)
                continue
            cfg = sp.config
            facts_reason = self.catalog_reason(sid)
            out.append(
                SidecarStatus(
                    id=sid,
                    protocol=cfg.protocol if cfg else "?",
                    mode=cfg.mode if cfg else "?",
                    enabled=cfg.enabled if cfg else False,
                    manifest="valid" if cfg else "invalid",
                    runtime="stopped" if (cfg and not cfg.enabled) else "failed",
                    tools=list(sp.entry.tools),
                    errors=[*sp.entry.errors, *sp.entry.warnings]
                    + ([sp.problem] if sp.problem and sp.problem not in sp.entry.errors else [])
                    + ([facts_reason] if facts_reason else []),
                    confinement=self.confinement(sid, None)
                    if self.confinement is not None and cfg is not None
                    else None,
                )
            )
        return out

    def shadowed(self, sidecar: str, tools: list[str]) -> list[dict[str, str]]:
        """What of MCP sidecar ``sidecar`` (serving ``tools``) another sidecar owns: tools the
        catalog gives to another, resources, templates and prompts an earlier one publishes."""
        pool = self.pools.get(sidecar)
        if pool is None or pool.config.protocol not in ("mcp", "mcp-http"):
            return []
        live = offer_lists.sessions(self.loaded.plan.sidecars, self.pools)
        owners = {name: self.catalog.owner(name) for name in tools}
        return offer_lists.shadowed_of(sidecar, live, owners)

    def catalog_reason(self, sidecar: str) -> str | None:
        """Why the catalog says ``sidecar``'s tools do not run (its ``runtime`` reason, or the
        ``sandbox: denied`` one that keeps it from starting)."""
        denied = self.catalog.denied_reason(sidecar)
        if denied is not None:
            return f"{denied.code}: {denied.message}; fix: {denied.hint}"
        for d in self.catalog.tools():
            if d.sidecar == sidecar:
                for r in d.stability.reasons:
                    if r.field == "runtime":
                        return r.message
        return None

    def health(self) -> HealthResult:
        """``system.health``: counts of sidecars and tools by state, and readiness."""
        counts = HealthCounts()
        tools = HealthCounts()
        by_sidecar: dict[str, list[str]] = {}
        critical: dict[str, str] = {}
        for d in self.catalog.tools():
            eff = d.stability.effective
            setattr(tools, eff, getattr(tools, eff) + 1)
            if d.sidecar is not None:
                by_sidecar.setdefault(d.sidecar, []).append(eff)
        for sid, sp in self.loaded.plan.sidecars.items():
            effs = by_sidecar.get(sid, [])
            cfg = sp.config
            if cfg is not None and not cfg.enabled:
                state = "disabled"
            elif not effs:
                pool = self.pools.get(sid)
                ok = pool is not None and pool.facts().runtime == "ready"
                state = "available" if ok else "unavailable"
            elif all(e == "available" for e in effs):
                state = "available"
            elif all(e in ("unavailable", "disabled") for e in effs):
                state = "unavailable"
            else:
                state = "degraded"
            setattr(counts, state, getattr(counts, state) + 1)
            if cfg is not None and cfg.critical:
                critical[sid] = state
        status: Literal["ok", "degraded"] = (
            "ok" if counts.unavailable == 0 and counts.degraded == 0 else "degraded"
        )
        return HealthResult(
            status=status,
            uptimeMs=round(self.uptime_ms(), 1),
            sidecars=counts,
            tools=tools,
            ready=all(state == "available" for state in critical.values()),
            critical=critical,
        )

    def stats(self) -> StatsResult:
        """``system.stats``: accounting per sidecar, tool and worker, and each confined
        sidecar's egress (``egress``: connections, refusals, bytes through the host's proxy)."""
        result = self.usage.stats(self.uptime_ms())
        if self.egress is not None:
            for sid, egress in self.egress().items():
                row = result.sidecars.get(sid)
                if row is not None:
                    row.egress = egress
        return result

    def uptime_ms(self) -> float:
        return (trio.current_time() - self.started_at) * 1000.0

    # single readings -----------------------------------------------------------------------

    def host_config(self) -> HostConfig:
        """The registry's ``host`` settings now (a reload may change them)."""
        return self.loaded.registry.host

    def descriptor(self, tool: str) -> Descriptor | None:
        return self.catalog.get(tool)

    def visible(self) -> list[Descriptor]:
        """The descriptors a model may see (``tools.list``)."""
        return self.catalog.visible()

    @property
    def revision(self) -> int:
        return self.catalog.revision

    def stderr_tail(self, sidecar: str, max_bytes: int) -> str | None:
        """The stderr tail of a running sidecar (live worker, else the last exited one; None:
        not running)."""
        pool = self.pools.get(sidecar)
        return pool.stderr_tail(max_bytes) if pool is not None else None

    def confinement_hints(self, sidecar: str, text: str) -> list[str]:
        """Which grants would allow what ``text`` (``sidecar``'s stderr) says its walls refused
        (empty: nothing, or the sidecar is not confined)."""
        return self.hints(sidecar, text) if self.hints is not None and text else []

    def workload(self, sidecar: str) -> tuple[int, list[int]] | None:
        """A running sidecar's calls running or queued and its workers' pids (None: not
        running)."""
        pool = self.pools.get(sidecar)
        if pool is None:
            return None
        return pool.inflight, [w.pid for w in pool.workers if w.pid is not None]

    def planned(self, sidecar: str) -> SidecarPlan | None:
        """The plan's entry of ``sidecar`` now."""
        return self.loaded.plan.sidecars.get(sidecar)

    def facts(self, sidecar: str) -> SidecarFacts | None:
        """What the pool of ``sidecar`` knows of it now (None: not running)."""
        pool = self.pools.get(sidecar)
        return pool.facts() if pool is not None else None

    def upgrade_of(self, sidecar: str) -> UpgradeField | None:
        """The package manager's ``upgrade`` state the catalog shows for ``sidecar``."""
        return self.catalog.upgrade_of(sidecar)

    def running_config(self, sidecar: str) -> SidecarConfig | None:
        """The configuration a sidecar runs with (its pool's, else the plan's)."""
        pool = self.pools.get(sidecar)
        if pool is not None:
            return pool.config
        sp = self.loaded.plan.sidecars.get(sidecar)
        return sp.config if sp is not None else None

    def manifest_of(self, tool: str) -> ToolManifest | None:
        tp = self.catalog.tool_plan(tool)
        return tp.manifest if tp is not None else None
