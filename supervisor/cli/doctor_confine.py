"""``toolhost doctor``'s confinement section (PROTOCOL 7): each sidecar's profile, what its plan
enforces on this kernel, and what its worker has, read from the running process."""

from __future__ import annotations

from typing import Any

import msgspec

from supervisor.contracts.confine import ConfinementFacts, ConfinePlan, Profile
from supervisor.contracts.registry import NetworkGrant
from supervisor.host.host import Host
from supervisor.policy.confine_explain import facts_label, label, planned_facts


class ConfineReport(msgspec.Struct, kw_only=True):
    """One sidecar's confinement, as ``toolhost doctor`` prints it (``--json`` keeps it all)."""

    mode: str
    label: str
    """``fs+net+seccomp``, ``off`` or ``denied``."""
    profile: dict[str, Any] = msgspec.field(default_factory=dict)
    plan: dict[str, Any] = msgspec.field(default_factory=dict)
    """What the plan enforces on this kernel: ``landlockAbi``, ``readRules``, ``writeRules``,
    ``listRules`` (folders granted listing alone), ``network``, ``syscalls``, ``processes``
    (how the limit is kept), ``missing``, ``fixes``."""
    enforced: ConfinementFacts | None = None
    """Read from the running worker (None: no worker reported yet)."""
    source: str = "plan"
    """``worker``: :attr:`enforced` was read from a worker; ``plan``: none ran yet."""
    refused: list[str] = msgspec.field(default_factory=list)
    denied: str = ""
    """Why no worker is started (``confinement-unavailable``)."""
    hints: list[str] = msgspec.field(default_factory=list)
    """What the last worker's stderr says its walls refused, and the grant that would allow it
    (a sidecar that cannot start because its profile misses a path)."""


def _profile(profile: Profile) -> dict[str, Any]:
    net = profile.network
    network: Any = (
        net
        if isinstance(net, str)
        else {"allow": list(net.allow), "loopback": list(net.loopback)}
        if isinstance(net, NetworkGrant)
        else str(net)
    )
    return {
        "project": profile.project,
        "read": list(profile.read),
        "write": list(profile.write),
        "network": network,
        "unix": list(profile.unix),
        "processes": profile.processes,
        "keep": profile.keep,
    }


def _keep(plan: ConfinePlan) -> str:
    """What happens to processes a worker leaves outside its process group when it ends."""
    if plan.pids != "cgroup":
        return "not enforced (no pids cgroup: processes in a session of their own outlive it)"
    return {
        "worker": "killed with the worker's group",
        "sidecar": "kept until the sidecar is removed or the host stops",
        "host": "kept until the sidecar is removed; left running at host stop",
    }[plan.keep]


def _plan(plan: ConfinePlan) -> dict[str, Any]:
    expected = planned_facts(plan)
    return {
        "landlockAbi": plan.landlock_abi,
        "readRules": len(plan.read),
        "writeRules": len(plan.write),
        "listRules": len(plan.listed),
        "filesystem": expected.filesystem,
        "network": expected.network,
        "netns": plan.netns or "none",
        "allow": list(plan.allow),
        "loopback": list(plan.loopback),
        "syscalls": expected.syscalls,
        "processes": f"{plan.processes} ({plan.pids})",
        "keep": _keep(plan),
        "missing": list(plan.missing),
        "fixes": list(plan.fixes),
    }


def report(host: Host, sidecar: str, stderr: str = "") -> ConfineReport | None:
    """``sidecar``'s confinement (None: not runnable, no plan); ``stderr``: its last worker's
    (searched for what the walls refused)."""
    confiner = host.confiner
    plan = confiner.plans.get(sidecar)
    if plan is None:
        return None
    denial = confiner.denials.get(sidecar)
    pool = host.pools.get(sidecar)
    facts = pool.statistics().confinement if pool is not None else None
    profile = confiner.profiles.get(sidecar)
    return ConfineReport(
        mode=plan.mode,
        label=label(plan, facts, denied=denial is not None),
        profile=_profile(profile) if profile is not None and plan.active else {},
        plan=_plan(plan) if plan.active else {},
        enforced=facts,
        source="worker" if facts is not None else "plan",
        refused=list(plan.refused),
        denied=f"{denial.message}; fix: {denial.hint}" if denial is not None else "",
        hints=confiner.hints(sidecar, stderr) if stderr else [],
    )


def render(rep: ConfineReport) -> list[str]:
    """The lines under a sidecar's heading."""
    if rep.mode == "off":
        return ["     confinement: off (host.confinement: off)"]
    out = [f"     confinement: {rep.label} ({rep.mode})"]
    p = rep.profile
    if p:
        net = p["network"]
        if isinstance(net, dict):
            net = f"allow {net['allow'] or '[]'}, loopback {net['loopback'] or '[]'}"
        grants = f"project {p['project']}, network {net}, processes {p['processes']}"
        if p.get("keep", "worker") != "worker":
            grants += f", keep {p['keep']}"
        if p["read"]:
            grants += f", read {p['read']}"
        if p["write"]:
            grants += f", write {p['write']}"
        if p["unix"]:
            grants += f", unix {p['unix']}"
        out.append(f"       profile: {grants}")
    q = rep.plan
    if q:
        out.append(
            f"       plan: filesystem {q['filesystem']} (Landlock ABI {q['landlockAbi']},"
            f" {q['readRules']} read and {q['writeRules']} write rules"
            + (f", {q['listRules']} listed" if q.get("listRules") else "")
            + f"), network {q['network']}"
            f" (namespace: {q['netns']}), syscalls {q['syscalls']}, processes {q['processes']}"
        )
        out.append(f"       leftover processes: {q['keep']}")
    f = rep.enforced
    if f is not None:
        nnp = "yes" if f.no_new_privs else "no"
        out.append(
            f"       enforced (read from its worker): {facts_label(f)}; filesystem {f.filesystem},"
            f" network {f.network}, syscalls {f.syscalls}, no_new_privs {nnp}"
        )
    elif not rep.denied:
        out.append("       enforced: no worker has run yet (the plan above is what it will get)")
    missing = f.missing if f is not None else q.get("missing", [])
    for m in missing:
        out.append(f"       missing: {m}")
    for fix in q.get("fixes", []) if missing else []:
        out.append(f"       fix: {fix}")
    for r in rep.refused:
        out.append(f"       grant refused: {r}")
    if rep.denied:
        out.append(f"       denied: {rep.denied}")
    for h in rep.hints:
        out.append(f"       fix (its stderr shows the walls refused it): {h}")
    return out
