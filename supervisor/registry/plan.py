"""From a loaded registry and the known catalog to a plan: what runs, and each tool's static facts.

# Strategy: everything the host can know before starting a process is decided here, once per
# (re)load: which sidecar owns which tool name, whether its entry is valid, enabled, resolvable,
# version-compatible, what its sandbox policy is. The runtime adds probe and runtime facts later
# through :class:`supervisor.registry.catalog.CatalogState`.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Callable

import msgspec

from supervisor.contracts.manifest import ToolManifest
from supervisor.contracts.registry import SidecarConfig
from supervisor.contracts.snapshot import (
    Discovery,
    ManifestState,
    PathDetails,
    PathState,
    Reason,
    UpgradeField,
    VersionState,
)
from supervisor.policy.paths import Resolution, host_path, resolve_command
from supervisor.policy.sandbox import default_for
from supervisor.policy.version import compatibility
from supervisor.protocols.fractalic_yaml import Route
from supervisor.registry.load import Registry, SidecarEntry, is_builtin
from supervisor.registry.manifests import KnownCatalog

SandboxPolicy = str  # allowed | approval-required | denied


class ToolPlan(msgspec.Struct, kw_only=True):
    """Static facts about one tool name."""

    name: str
    sidecar: str | None
    protocol: str | None
    manifest: ToolManifest | None
    discovery: Discovery
    manifest_state: ManifestState = "valid"
    path: PathState = "resolved"
    path_details: PathDetails | None = None
    version: VersionState = "unknown"
    upgrade: UpgradeField = "idle"
    sandbox: SandboxPolicy = "allowed"
    reasons: dict[str, Reason] = msgspec.field(default_factory=dict)
    install: str | None = None
    declared: bool = True
    """Listed in the registry (False: known only from what the sidecar announces)."""
    autodiscovered: bool = False
    """Found by autodiscovery; a registry sidecar announcing the same name takes it over."""
    duplicates: list[str] = msgspec.field(default_factory=list)
    """Every sidecar that declares this tool, when more than one does (then none serves it)."""


class SidecarPlan(msgspec.Struct, kw_only=True):
    """How to run one sidecar, or why it cannot run."""

    id: str
    entry: SidecarEntry
    resolution: Resolution | None = None
    argv: list[str] = msgspec.field(default_factory=list)
    cwd: str = ""
    runnable: bool = False
    problem: str = ""
    scripts: dict[str, list[str]] = msgspec.field(default_factory=dict)
    """simple-json: the argv of the script behind each tool (autodiscovered folders)."""
    routes: dict[str, Route] = msgspec.field(default_factory=dict)
    """Tools of autodiscovered folders declared by ``*.yaml`` manifests (PROTOCOL 3.3)."""
    announces: bool = False
    """An autodiscovered folder (``auto:<folder>``): its worker may announce tools the plan does
    not list (multi-tool scripts) and leave out planned scripts that turned out to publish
    others; the catalog follows what it announced (PROTOCOL 3.3)."""

    @property
    def config(self) -> SidecarConfig | None:
        return self.entry.config

    @property
    def fingerprint(self) -> bytes:
        return self.entry.fingerprint


class Plan(msgspec.Struct, kw_only=True):
    tools: dict[str, ToolPlan] = msgspec.field(default_factory=dict)
    sidecars: dict[str, SidecarPlan] = msgspec.field(default_factory=dict)


def sandbox_for(cfg: SidecarConfig | None, tool: str, manifest: ToolManifest | None) -> str:
    """Policy for ``tool``: the registry's per-tool or sidecar value, else the manifest default,
    else the default by name (:mod:`supervisor.policy.sandbox`)."""
    value = cfg.sandbox if cfg is not None else None
    if isinstance(value, dict):
        if tool in value:
            return value[tool]
    elif value is not None:
        return value
    if manifest is not None and manifest.sandbox is not None:
        return manifest.sandbox
    return default_for(tool)


def _reason(field: str, code: str, message: str, hint: str) -> Reason:
    return Reason(field=field, code=code, message=message, hint=hint)


def build_plan(
    registry: Registry,
    known: KnownCatalog,
    *,
    host_version: str,
    path_env: str | None = None,
    host_python: str = sys.executable,
    which: Callable[[str, str], str | None] | None = None,
) -> Plan:
    """Decide every static fact. Never raises for bad input."""
    if path_env is None:
        path_env = host_path(os.environ.get("PATH"), sys.executable)
    which = which or (lambda name, path: shutil.which(name, path=path))
    plan = Plan()
    for sid, entry in registry.sidecars.items():
        plan.sidecars[sid] = _plan_sidecar(registry, entry, path_env, host_python, which)
    for sid, sp in plan.sidecars.items():
        entry = sp.entry
        cfg = entry.config
        for tool in entry.tools:
            first = plan.tools.get(tool)
            if first is not None and first.sidecar != sid:
                _mark_duplicate(plan, first, sid)
                continue
            plan.tools[tool] = plan_tool(sp, tool, known, host_version, cfg)
    for name, kt in known.tools.items():
        if name not in plan.tools:
            registered = plan.sidecars.get(kt.sidecar) if kt.sidecar else None
            if registered is not None and registered.config is not None:
                # The bundled sidecar runs, listing other tools: `toolhost init` would not help.
                hint = (
                    f"sidecar {kt.sidecar!r} is in the registry but does not list {name}: add"
                    f" it to sidecars.{kt.sidecar}.tools (docs/sidecars.md says what it needs)"
                )
            else:
                hint = kt.install or (
                    f"add a sidecar serving {name} to tools/external.tools.jsonc"
                    + (
                        f" (the bundled one is {kt.sidecar!r}; `toolhost init` writes it)"
                        if kt.sidecar
                        else ""
                    )
                )
            plan.tools[name] = ToolPlan(
                name=name,
                sidecar=None,
                protocol=None,
                manifest=kt.manifest,
                discovery="missing",
                sandbox=sandbox_for(None, name, kt.manifest),
                install=kt.install,
                reasons={
                    "discovery": _reason(
                        "discovery",
                        "not-configured",
                        f"no sidecar in the registry serves {name}",
                        hint,
                    )
                },
            )
    return plan


def _mark_duplicate(plan: Plan, first: ToolPlan, other: str) -> None:
    """Two sidecars declare the same tool: neither may serve it until the operator chooses; the
    reason (and a warning on each entry) names both."""
    owners = sorted({*first.duplicates, first.sidecar or "", other} - {""})
    first.duplicates = owners
    first.manifest_state = "invalid"
    first.reasons["manifest"] = _reason(
        "manifest",
        "duplicate-tool",
        f"{first.name} is declared by more than one sidecar: {', '.join(owners)}",
        f"keep {first.name} in the tools of one of {', '.join(owners)}",
    )
    for sid in (first.sidecar, other):
        sp = plan.sidecars.get(sid or "")
        if sp is None:
            continue
        note = f"sidecars.{sid}.tools: {first.name} is also declared by " + ", ".join(
            o for o in owners if o != sid
        )
        if note not in sp.entry.warnings:
            sp.entry.warnings.append(note)


def _plan_sidecar(
    registry: Registry,
    entry: SidecarEntry,
    path_env: str,
    host_python: str,
    which: Callable[[str, str], str | None],
) -> SidecarPlan:
    sp = SidecarPlan(id=entry.id, entry=entry)
    cfg = entry.config
    if cfg is None:
        sp.problem = "; ".join(entry.errors) or "invalid entry"
        return sp
    anchor = "app" if cfg.cwd == "project" else cfg.cwd
    anchor_dir = registry.anchor_dir(entry, anchor)
    sp.cwd = anchor_dir
    if cfg.protocol == "mcp-http":
        # A remote server: nothing to resolve; its worker connects to argv[0], the URL.
        sp.argv = [cfg.url or ""]
        if not cfg.enabled:
            sp.problem = "disabled"
        else:
            sp.runnable = True
        return sp
    env_path = cfg.env.get("PATH", path_env)
    sp.resolution = resolve_command(
        cfg.command or "",
        anchor_name=anchor,
        anchor_dir=anchor_dir,
        path_env=env_path,
        host_python=host_python,
        which=which,
    )
    if sp.resolution.executable:
        sp.argv = [sp.resolution.executable, *cfg.args]
    if not cfg.enabled:
        sp.problem = "disabled"
    elif sp.resolution.state != "resolved":
        sp.problem = sp.resolution.message
    else:
        sp.runnable = True
    return sp


def plan_tool(
    sp: SidecarPlan,
    tool: str,
    known: KnownCatalog,
    host_version: str,
    cfg: SidecarConfig | None,
) -> ToolPlan:
    kt = known.tools.get(tool)
    manifest = kt.manifest if kt else None
    tp = ToolPlan(
        name=tool,
        sidecar=sp.id,
        protocol=cfg.protocol if cfg else None,
        manifest=manifest,
        discovery="configured",
        sandbox=sandbox_for(cfg, tool, manifest),
        install=kt.install if kt else None,
    )
    reasons = tp.reasons
    if cfg is None:
        tp.manifest_state = "invalid"
        message = "; ".join(sp.entry.errors) or "invalid registry entry"
        reasons["manifest"] = _reason(
            "manifest",
            "manifest-invalid",
            message,
            "fix the entry in tools/external.tools.jsonc (`toolhost doctor` shows every problem)",
        )
        tp.path = "unresolved"
        reasons["path"] = _reason("path", "not-resolved", "not resolved: the entry is invalid", "")
        return tp
    if is_builtin(tool):
        tp.manifest_state = "invalid"
        reasons["manifest"] = _reason(
            "manifest",
            "duplicates-builtin",
            f"{tool} is in a builtin coding namespace; sidecars must not duplicate first-party "
            "primitives",
            f"remove {tool} from sidecars.{sp.id}.tools",
        )
    if not cfg.enabled:
        tp.discovery = "disabled"
        reasons["discovery"] = _reason(
            "discovery",
            "sidecar-disabled",
            f"sidecar {sp.id} is disabled",
            f'set "enabled": true on sidecars.{sp.id} to use it',
        )
    res = sp.resolution
    if res is not None:
        tp.path = res.state
        tp.path_details = res.details
        if res.state == "unresolved":
            reasons["path"] = _reason(
                "path",
                "command-not-found",
                res.message,
                f"install {res.details.command!r} or fix sidecars.{sp.id}.command",
            )
        elif res.state == "outside-root-denied":
            reasons["path"] = _reason(
                "path",
                "outside-root-denied",
                res.message,
                "use a relative command inside the anchor (./tools/packages/...) "
                "or a bare PATH name",
            )
    tp.version, vmsg = compatibility(
        host_version,
        cfg.compatible_core,
        protocol=cfg.protocol,
        protocol_version=cfg.protocol_version,
    )
    if tp.version == "incompatible":
        reasons["version"] = _reason(
            "version",
            "version-incompatible",
            vmsg,
            f"install a {sp.id} package whose compatibleCore admits toolhost {host_version}",
        )
    tp.upgrade = cfg.upgrade
    return tp
