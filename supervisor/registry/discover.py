"""Autodiscovery of simple-json scripts (PROTOCOL 3.3): ``autodiscover`` folders -> plan entries.

# Strategy: scanning is a plain directory listing (no process is run here): every script in a
# folder becomes a tool named after the file (``weather.py`` -> ``weather``), served by one
# synthetic sidecar per folder, ``auto:<folder>``, whose worker probes the scripts when it starts
# (``{"__test__": true}``, ``--fractalic-dump-schema``) and reports the ones that fail as
# unavailable with their reason. A tool the registry already assigns to a sidecar is not taken
# (registry entries override discovered tools); the catalog also lets a registry sidecar that
# *announces* the same name (an MCP server) take it over. The folder's fingerprint covers each
# script's size and mtime, so a reload restarts (and re-probes) only a folder that changed.
"""

from __future__ import annotations

import os
import re
import stat
import sys

import msgspec
from msgspec import UnsetType

from supervisor.contracts.registry import (
    TOOL_NAME_PATTERN,
    AutodiscoverConfig,
    PoolConfig,
    ProbeConfig,
    SidecarConfig,
)
from supervisor.contracts.snapshot import PathDetails
from supervisor.policy.paths import Resolution, is_inside
from supervisor.protocols import fractalic_yaml
from supervisor.protocols.fractalic_yaml import Route
from supervisor.registry.load import Registry, SidecarEntry
from supervisor.registry.manifests import KnownCatalog
from supervisor.registry.plan import Plan, SidecarPlan, plan_tool

AUTO_PREFIX = "auto:"
"""Synthetic sidecar ids are ``auto:<folder>``; the colon keeps them apart from registry ids."""
PYTHON_PREFIX = "auto-python:"
"""The folder's ``command: python`` (``module:function``) tools: ``auto-python:<folder>``."""


class Script(msgspec.Struct, frozen=True, kw_only=True):
    """One script found in a folder."""

    name: str
    rel: str
    """Path relative to the app root (for messages and descriptors; never written back)."""
    argv: list[str]
    size: int
    mtime_ns: int


class FolderScan(msgspec.Struct, kw_only=True):
    """What one ``autodiscover`` folder holds."""

    config: AutodiscoverConfig
    rel: str
    folder: str
    scripts: list[Script] = msgspec.field(default_factory=list)
    errors: list[str] = msgspec.field(default_factory=list)
    routes: dict[str, Route] = msgspec.field(default_factory=dict)
    """Tools declared by ``*.yaml`` manifests (PROTOCOL 3.3), by tool name."""
    stamps: list[tuple[str, int, int]] = msgspec.field(default_factory=list)
    """``(file, size, mtime_ns)`` of every manifest and manifest entry (the fingerprint)."""
    skipped: list[tuple[str, str]] = msgspec.field(default_factory=list)
    """``(file, why)`` of files that are not tools by design (helpers, data files, manifest
    entries, scripts a manifest overrides); ``toolhost doctor`` lists them."""

    @property
    def sidecar(self) -> str:
        return AUTO_PREFIX + self.rel


def _script_argv(path: str, name: str, mode: int, host_python: str) -> list[str] | None:
    """How to run a file: ``.py`` with the host's interpreter, else the file itself if
    executable; None for anything else (data files, READMEs)."""
    if name.endswith(".py"):
        return [host_python, path]
    if mode & (stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH):
        return [path]
    return None


MANIFEST_SUFFIXES = (".yaml", ".yml")
MANIFEST_HINT = "fix the manifest (name, description, command, entry, parameters; PROTOCOL 3.3)"


def _stamp(path: str) -> tuple[int, int]:
    try:
        st = os.stat(path)
    except OSError:
        return -1, -1
    return st.st_size, st.st_mtime_ns


def _read_capped(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read(fractalic_yaml.MAX_YAML_BYTES + 1)


def _entry_path(scan: FolderScan, entry: str) -> tuple[str, str]:
    path = os.path.normpath(os.path.join(scan.folder, entry))
    return path, os.path.realpath(path)


def _entry_problems(scan: FolderScan, entry: str, real_root: str) -> list[str]:
    """Why a script ``entry`` cannot be used (outside the folder, leaving the root, missing)."""
    path, real = _entry_path(scan, entry)
    if os.path.isabs(entry) or not is_inside(scan.folder, path):
        return [f"entry {entry!r} is outside the folder {scan.rel}"]
    if not is_inside(real_root, real):
        return [f"entry {entry!r} links outside the app root"]
    if not os.path.isfile(real):
        return [f"entry {entry!r}: no such file"]
    return []


def _manifest_route(
    scan: FolderScan,
    file_rel: str,
    manifest: fractalic_yaml.Manifest,
    real_root: str,
    host_python: str,
) -> Route:
    """The route of a valid manifest, or an unavailable one naming every problem."""
    description = manifest.description or f"{manifest.command} tool {file_rel}"
    base = Route(
        kind="unavailable",
        source=file_rel,
        description=description,
        parameters=manifest.parameters,
    )
    replace = msgspec.structs.replace
    if manifest.command == "mcp":
        return replace(
            base,
            code="mcp-manifest",
            reason=f"{file_rel}: an mcp manifest is not hosted through the tools folder",
            hint=fractalic_yaml.mcp_hint(manifest.name, manifest.entry),
        )
    if manifest.command == "python":
        # Served by the folder's long-lived ``python`` worker (sidecars.fractalic_python);
        # the module file's stamp makes a reload restart that worker when the module changes.
        module = manifest.entry.split(":", 1)[0]
        module_path = os.path.join(scan.folder, *module.split(".")) + ".py"
        if os.path.isfile(module_path):
            scan.stamps.append((module_path, *_stamp(module_path)))
        return replace(base, kind="python", argv=[manifest.entry])
    path, real = _entry_path(scan, manifest.entry)
    problems = _entry_problems(scan, manifest.entry, real_root)
    argv: list[str] = []
    if not problems:
        scan.stamps.append((path, *_stamp(path)))
        if manifest.command == "python-cli":
            argv = [host_python, path]
        elif manifest.command == "bash-cli":
            argv = ["bash", path]
        else:
            mode = os.stat(real).st_mode
            found = _script_argv(path, os.path.basename(path), mode, host_python)
            if found is None:
                problems.append(f"entry {manifest.entry!r} is neither a .py file nor executable")
            argv = found or []
    if problems:
        return replace(
            base,
            code="manifest-invalid",
            reason=f"{file_rel}: " + "; ".join(problems),
            hint=MANIFEST_HINT,
        )
    kind: fractalic_yaml.RouteKind = "simple-json" if manifest.command == "simple-json" else "cli"
    return replace(base, kind=kind, argv=argv)


def _scan_manifests(
    scan: FolderScan, names: list[str], real_root: str, host_python: str
) -> set[str]:
    """Read the folder's ``*.yaml`` manifests into ``scan.routes``; the stems they claim.

    Every manifest becomes a tool: a usable one its route, an unusable one an unavailable
    descriptor whose reason names the file and all of its problems.
    """
    stems: set[str] = set()
    for fname in names:
        if fname.startswith((".", "_")) or not fname.endswith(MANIFEST_SUFFIXES):
            continue
        path = os.path.join(scan.folder, fname)
        if not os.path.isfile(path):
            continue
        file_rel = os.path.join(scan.rel, fname)
        if not is_inside(real_root, os.path.realpath(path)):
            # Never read a file outside the root (its text would end up in a reason).
            scan.errors.append(f"{file_rel}: links outside the app root; skipped")
            continue
        stem = fname.rsplit(".", 1)[0]
        scan.stamps.append((path, *_stamp(path)))
        try:
            data = _read_capped(path)
        except OSError as exc:
            doc, problems = None, [f"cannot read: {exc.strerror or exc}"]
        else:
            doc, problems = fractalic_yaml.load_yaml(data)
        manifest = None
        name = stem
        if not problems:
            manifest, name, problems = fractalic_yaml.validate(doc, stem, TOOL_NAME_PATTERN)
        if not re.match(TOOL_NAME_PATTERN, name):
            scan.errors.append(f"{file_rel}: {name!r} is not a valid tool name; skipped")
            continue
        if name in scan.routes:
            scan.errors.append(
                f"{file_rel}: tool {name} is already declared by "
                f"{scan.routes[name].source}; skipped"
            )
            continue
        stems.add(stem)
        if manifest is None:
            entry = doc.get("entry") if isinstance(doc, dict) else None
            if isinstance(entry, str) and entry and ":" not in entry:
                problems += _entry_problems(scan, entry, real_root)
            scan.routes[name] = Route(
                kind="unavailable",
                source=file_rel,
                description=f"unusable manifest {file_rel}",
                code="manifest-invalid",
                reason=f"{file_rel}: " + "; ".join(problems),
                hint=MANIFEST_HINT,
            )
            continue
        scan.routes[name] = _manifest_route(scan, file_rel, manifest, real_root, host_python)
    return stems


def scan_folder(app_root: str, cfg: AutodiscoverConfig, *, host_python: str) -> FolderScan:
    """List the scripts of one folder (top level only; names starting with ``.`` or ``_`` are
    helpers and skipped)."""
    rel = os.path.normpath(cfg.path)
    folder = os.path.normpath(os.path.join(app_root, rel))
    scan = FolderScan(config=cfg, rel=rel, folder=folder)
    where = f"autodiscover {cfg.path!r}"
    if os.path.isabs(cfg.path) or not is_inside(app_root, folder):
        scan.errors.append(f"{where}: must be a folder inside the app root (relative path)")
        return scan
    real_root = os.path.realpath(app_root)
    try:
        names = sorted(os.listdir(folder))
    except FileNotFoundError:
        scan.errors.append(f"{where}: no such folder")
        return scan
    except OSError as exc:
        scan.errors.append(f"{where}: cannot list: {exc.strerror or exc}")
        return scan
    seen: dict[str, str] = {}
    stems = _scan_manifests(scan, names, real_root, host_python)
    for name in scan.routes:
        seen[name] = "a manifest"
    entries = {r.argv[-1] for r in scan.routes.values() if r.argv and r.kind != "python"}
    for r in scan.routes.values():
        if r.kind == "python":  # the module file of a module:function tool is not a script
            module = r.argv[0].split(":", 1)[0]
            entries.add(os.path.join(scan.folder, *module.split(".")) + ".py")
    for fname in names:
        file_rel = os.path.join(rel, fname)
        if fname.startswith((".", "_")):
            scan.skipped.append((file_rel, "a helper (the name starts with '.' or '_')"))
            continue
        if fname.endswith(MANIFEST_SUFFIXES):
            continue
        path = os.path.join(folder, fname)
        try:
            st = os.stat(path)
        except OSError:
            continue
        if not stat.S_ISREG(st.st_mode):
            continue
        if path in entries:  # a manifest's entry: the manifest is the tool
            scan.skipped.append((file_rel, "the entry of a manifest (the manifest is the tool)"))
            continue
        argv = _script_argv(path, fname, st.st_mode, host_python)
        if argv is None:
            scan.skipped.append((file_rel, "not a script (neither .py nor executable)"))
            continue
        if not is_inside(real_root, os.path.realpath(path)):
            scan.errors.append(f"{file_rel}: links outside the app root; skipped")
            continue
        name = fname.rsplit(".", 1)[0] if "." in fname else fname
        if name in stems or name in scan.routes:
            # A manifest of the same stem (or tool name) overrides the script.
            source = scan.routes[name].source if name in scan.routes else f"{name}.yaml"
            if name not in scan.routes:
                source = os.path.join(rel, source)
            scan.skipped.append((file_rel, f"overridden by the manifest {source}"))
            continue
        if not re.match(TOOL_NAME_PATTERN, name):
            scan.errors.append(f"{file_rel}: {name!r} is not a valid tool name; skipped")
            continue
        if name in seen:
            scan.errors.append(
                f"{file_rel}: tool {name} is already served by {seen[name]}; skipped"
            )
            continue
        seen[name] = file_rel
        scan.scripts.append(
            Script(name=name, rel=file_rel, argv=argv, size=st.st_size, mtime_ns=st.st_mtime_ns)
        )
    return scan


def scan_all(registry: Registry, *, host_python: str = sys.executable) -> list[FolderScan]:
    """Scan every ``autodiscover`` folder of the registry, in order (duplicates once)."""
    out: list[FolderScan] = []
    seen: set[str] = set()
    for cfg in registry.autodiscover:
        scan = scan_folder(registry.app_root, cfg, host_python=host_python)
        if scan.rel in seen:
            continue
        seen.add(scan.rel)
        out.append(scan)
    return out


def add_discovered(
    plan: Plan,
    registry: Registry,
    known: KnownCatalog,
    scans: list[FolderScan],
    *,
    host_version: str,
) -> list[str]:
    """Add one synthetic simple-json sidecar per scanned folder, and its tools, to ``plan``.

    Returns:
        Problems to report with the registry's (unusable folders, skipped files, tools left to
        the registry sidecar that already serves them).
    """
    problems: list[str] = []
    for scan in scans:
        problems.extend(scan.errors)
        cfg = scan.config
        taken: list[Script] = []
        for script in scan.scripts:
            owner = plan.tools.get(script.name)
            if owner is not None and owner.discovery != "missing":
                problems.append(
                    f"{script.rel}: {script.name} is served by sidecar {owner.sidecar} "
                    "(registry entries override discovered tools); the script is not used"
                )
                continue
            taken.append(script)
        routes: dict[str, Route] = {}
        for name, route in scan.routes.items():
            owner = plan.tools.get(name)
            if owner is not None and owner.discovery != "missing":
                problems.append(
                    f"{route.source}: {name} is served by sidecar {owner.sidecar} "
                    "(registry entries override discovered tools); the manifest is not used"
                )
                continue
            routes[name] = route
        python = {n: r for n, r in routes.items() if r.kind == "python"}
        routes = {n: r for n, r in routes.items() if r.kind != "python"}
        if python:
            _add_python_sidecar(plan, registry, known, scan, python, host_version=host_version)
        if not taken and not routes:
            continue
        names = [s.name for s in taken] + list(routes)
        sid = scan.sidecar
        config = SidecarConfig(
            command=f"./{scan.rel}",
            protocol="simple-json",
            tools=names,
            timeout_ms=cfg.timeout_ms,
            pool=PoolConfig(min=1, max=cfg.concurrency),
            probe=ProbeConfig(interval_ms=0, timeout_ms=cfg.probe_timeout_ms),
            sandbox=cfg.sandbox,
            confine=cfg.confine,
        )
        fingerprint = msgspec.json.encode(
            [
                cfg,
                [(s.name, s.argv, s.size, s.mtime_ns) for s in taken],
                routes,
                scan.stamps,
            ]
        )
        entry = SidecarEntry(
            id=sid,
            source=f"autodiscover:{scan.rel}",
            config_dir=registry.app_root,
            config=config,
            tools=names,
            fingerprint=fingerprint,
        )
        details = PathDetails(
            base="app", command=f"./{scan.rel}", mode="relative", portable=True, rootSafe=True
        )
        sp = SidecarPlan(
            id=sid,
            entry=entry,
            resolution=Resolution(state="resolved", details=details),
            cwd=registry.app_root,
            runnable=True,
            scripts={s.name: list(s.argv) for s in taken},
            routes=routes,
            announces=True,
        )
        plan.sidecars[sid] = sp
        for script in taken:
            tp = plan_tool(sp, script.name, known, host_version, config)
            tp.autodiscovered = True
            tp.path_details = PathDetails(
                base="app",
                command=f"./{script.rel}",
                mode="relative",
                portable=True,
                rootSafe=True,
            )
            plan.tools[script.name] = tp
        for name, route in routes.items():
            tp = plan_tool(sp, name, known, host_version, config)
            tp.autodiscovered = True
            tp.path_details = PathDetails(
                base="app",
                command=f"./{route.source}",
                mode="relative",
                portable=True,
                rootSafe=True,
            )
            plan.tools[name] = tp
    return problems


def _listed(value: list[str] | UnsetType) -> list[str]:
    return [] if isinstance(value, UnsetType) else list(value)


def _add_python_sidecar(
    plan: Plan,
    registry: Registry,
    known: KnownCatalog,
    scan: FolderScan,
    tools: dict[str, Route],
    *,
    host_version: str,
) -> None:
    """One long-lived SDK worker for the folder's ``command: python`` manifests (PROTOCOL 3.3)."""
    cfg = scan.config
    sid = PYTHON_PREFIX + scan.rel
    table = {
        "folder": scan.folder,
        "tools": [
            {
                "name": name,
                "entry": r.argv[0],
                "description": r.description,
                "parameters": r.parameters,
            }
            for name, r in tools.items()
        ],
    }
    config = SidecarConfig(
        command="python",
        args=["-m", "sidecars.fractalic_python"],
        env={"TOOLHOST_FRACTALIC_TOOLS": msgspec.json.encode(table).decode()},
        protocol="process-json",
        tools=list(tools),
        timeout_ms=cfg.timeout_ms,
        pool=PoolConfig(min=1, max=1),
        sandbox=cfg.sandbox,
        spawn="exec",
        # The worker imports the folder's modules: confined, it reads the folder (PROTOCOL 7:
        # the program it runs is granted read), besides what the folder's ``confine`` grants.
        confine=msgspec.structs.replace(
            cfg.confine, read=[*_listed(cfg.confine.read), scan.folder]
        ),
    )
    entry = SidecarEntry(
        id=sid,
        source=f"autodiscover:{scan.rel}",
        config_dir=registry.app_root,
        config=config,
        tools=list(tools),
        fingerprint=msgspec.json.encode([cfg, tools, scan.stamps]),
    )
    details = PathDetails(
        base="host-python", command="python", mode="path", portable=True, rootSafe=True
    )
    sp = SidecarPlan(
        id=sid,
        entry=entry,
        resolution=Resolution(state="resolved", details=details),
        argv=[sys.executable, "-m", "sidecars.fractalic_python"],
        cwd=registry.app_root,
        runnable=True,
    )
    plan.sidecars[sid] = sp
    for name, route in tools.items():
        tp = plan_tool(sp, name, known, host_version, config)
        tp.autodiscovered = True
        tp.path_details = PathDetails(
            base="app", command=f"./{route.source}", mode="relative", portable=True, rootSafe=True
        )
        plan.tools[name] = tp
