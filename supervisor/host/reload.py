"""What a registry reload does, decided from the running plan and the new one (pure).

# Strategy: :func:`diff_plans` compares the plan the host runs with the plan just read and says
# what to do: which sidecars are added, removed, restarted (their entry's fingerprint or argv
# changed) or unchanged, which pools to stop and to start, and the plan to run from now, in
# which a running sidecar whose new entry is invalid keeps its previous configuration (with a
# warning that says so). It reads no clock, starts nothing and changes neither plan, so every
# case is a table in ``tests/unit``; ``Host.reload`` is the one place that acts on it.
# :func:`needs_restart` names the ``host`` settings a reload cannot apply.
"""

from __future__ import annotations

from collections.abc import Collection

import msgspec

from supervisor.contracts.registry import HostConfig
from supervisor.registry.plan import Plan

RESTART_SETTINGS = (
    "socket",
    "ws",
    "auditLog",
    "auditMaxBytes",
    "auditKeep",
    "maxFrameBytes",
    "maxConnections",
    "logFormat",
    "telemetry",
    "quotaState",
    "zygote.enabled",
    "zygote.replyTimeoutMs",
)
"""``host`` settings read once when toolhost starts: a reload cannot apply a change to them."""


def needs_restart(old: HostConfig, new: HostConfig) -> list[str]:
    """The ``host.*`` settings of :data:`RESTART_SETTINGS` that differ between the two."""
    before, after = msgspec.to_builtins(old), msgspec.to_builtins(new)
    changed = []
    for name in RESTART_SETTINGS:
        a, b = before, after
        for part in name.split("."):
            a = a.get(part) if isinstance(a, dict) else None
            b = b.get(part) if isinstance(b, dict) else None
        if a != b:
            changed.append(f"host.{name}")
    return changed


class ReloadResult(msgspec.Struct, kw_only=True, rename="camel"):
    """What a registry reload did."""

    applied: bool
    revision: int
    added: list[str] = msgspec.field(default_factory=list)
    removed: list[str] = msgspec.field(default_factory=list)
    restarted: list[str] = msgspec.field(default_factory=list)
    unchanged: list[str] = msgspec.field(default_factory=list)
    errors: list[str] = msgspec.field(default_factory=list)
    needs_restart: list[str] = msgspec.field(default_factory=list)
    """``host`` settings that changed but apply only when toolhost restarts (still the old)."""

    def summary(self) -> str:
        if not self.applied:
            return "kept the running registry: " + "; ".join(self.errors)
        parts = [f"revision {self.revision}"]
        for name in ("added", "removed", "restarted"):
            items = getattr(self, name)
            if items:
                parts.append(f"{name} {', '.join(items)}")
        if self.errors:
            parts.append(f"{len(self.errors)} problem(s): " + "; ".join(self.errors))
        if self.needs_restart:
            parts.append(f"not applied until toolhost restarts: {', '.join(self.needs_restart)}")
        return ", ".join(parts)


class PlanDiff(msgspec.Struct, kw_only=True):
    """What a reload does to the sidecars (see :func:`diff_plans`)."""

    plan: Plan
    """The plan to run from now on."""
    added: list[str] = msgspec.field(default_factory=list)
    removed: list[str] = msgspec.field(default_factory=list)
    restarted: list[str] = msgspec.field(default_factory=list)
    unchanged: list[str] = msgspec.field(default_factory=list)
    stop: list[str] = msgspec.field(default_factory=list)
    """Pools to stop (removed and restarted sidecars), in name order."""
    start: list[str] = msgspec.field(default_factory=list)
    """Pools to start (added and restarted sidecars), in name order."""
    kept: list[str] = msgspec.field(default_factory=list)
    """One message per running sidecar whose new entry is invalid: it keeps its previous
    configuration."""


def diff_plans(old: Plan, new: Plan, running: Collection[str]) -> PlanDiff:
    """Compare the running plan ``old`` with the freshly read ``new``; neither is changed.

    Args:
        old: The plan the host runs now.
        new: The plan built from the registry as it is now.
        running: The sidecars that have a pool now.
    """
    sidecars = dict(new.sidecars)
    tools = dict(new.tools)
    diff = PlanDiff(plan=Plan(tools=tools, sidecars=sidecars))
    kept: set[str] = set()
    for sid, sp in new.sidecars.items():
        before = old.sidecars.get(sid)
        if sp.config is None and before is not None and before.config is not None:
            if sid not in running:
                continue
            msg = (
                f"sidecars.{sid}: new entry invalid ({'; '.join(sp.entry.errors)}); "
                "still running the previous configuration"
            )
            diff.kept.append(msg)
            entry = msgspec.structs.replace(before.entry, warnings=[msg])
            sidecars[sid] = msgspec.structs.replace(before, entry=entry)
            kept.add(sid)
            for tool, tp in old.tools.items():
                if tp.sidecar == sid:
                    tools[tool] = tp
    for sid in sorted(set(old.sidecars) | set(sidecars)):
        before, after = old.sidecars.get(sid), sidecars.get(sid)
        if after is None:
            diff.removed.append(sid)
            diff.stop.append(sid)
        elif before is None:
            diff.added.append(sid)
            diff.start.append(sid)
        elif before.fingerprint != after.fingerprint or before.argv != after.argv:
            diff.restarted.append(sid)
            diff.stop.append(sid)
            diff.start.append(sid)
        else:
            diff.unchanged.append(sid)
            if sid in running and sid not in kept:
                sidecars[sid] = before  # the running pool's own plan entry stays in force
    return diff
