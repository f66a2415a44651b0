"""``toolhost doctor``'s account of ``autodiscover`` folders: each file's route, or why not.

# Strategy: the folder listing is re-read (a plain directory scan, no process run) for the static
# facts - manifests and their problems, helpers, data files, manifest entries, scripts a manifest
# overrides - and the running folder worker is asked what discovery found for each script (the
# route that answered: simple-json probe, multi-schema, schema dump, --help; or every step that
# did not). Tools a registry sidecar took over are named with that sidecar.
"""

from __future__ import annotations

import msgspec

from supervisor.host.host import Host
from supervisor.registry.discover import AUTO_PREFIX, FolderScan, scan_all
from supervisor.workers.simple_json import SimpleJsonWorker

ROUTE_NAMES = {
    "simple-json": "simple-json probe",
    "multi-schema": "multi-schema",
    "schema-dump": "schema dump",
    "help": "help",
}


class FileRoute(msgspec.Struct, kw_only=True):
    """One file of a folder: how it became tools, or why it did not."""

    file: str
    route: str
    """``yaml``, ``simple-json probe``, ``multi-schema``, ``schema dump``, ``help``, or
    ``not registered``."""
    tools: list[str] = msgspec.field(default_factory=list)
    why: list[str] = msgspec.field(default_factory=list)


class FolderReport(msgspec.Struct, kw_only=True):
    folder: str
    sidecar: str
    files: list[FileRoute] = msgspec.field(default_factory=list)


def _worker(host: Host, sidecar: str) -> SimpleJsonWorker | None:
    pool = host.pools.get(sidecar)
    if pool is None:
        return None
    for w in pool.workers:
        if isinstance(w, SimpleJsonWorker) and w.discoveries:
            return w
    return None


def _owner_note(host: Host, name: str, sidecar: str) -> str | None:
    owner = host.catalog.owner(name)
    if owner is not None and owner != sidecar and not owner.startswith("auto-python:"):
        return f"{name} is served by sidecar {owner} (registry entries override discovered tools)"
    return None


def _folder(host: Host, scan: FolderScan) -> FolderReport:
    sidecar = scan.sidecar
    rep = FolderReport(folder=scan.rel, sidecar=sidecar)
    for name, route in scan.routes.items():
        fr = FileRoute(file=route.source, route="yaml", tools=[name])
        if route.kind == "unavailable":
            fr.why.append(f"unavailable: {route.reason}")
        elif route.kind == "python":
            fr.why.append(f"module:function {route.argv[0]} in the folder's python worker")
        note = _owner_note(host, name, sidecar)
        if note:
            fr.why.append(note)
        rep.files.append(fr)
    worker = _worker(host, sidecar)
    for script in scan.scripts:
        disc = worker.discoveries.get(script.rel) if worker is not None else None
        note = _owner_note(host, script.name, sidecar)
        if note:
            rep.files.append(FileRoute(file=script.rel, route="not registered", why=[note]))
            continue
        if disc is None:
            why = "not probed: the folder's worker is not running (see the sidecar above)"
            rep.files.append(FileRoute(file=script.rel, route="not registered", why=[why]))
            continue
        if disc.route == "none":
            fr = FileRoute(file=script.rel, route="not registered", tools=[script.name])
            fr.why = [f"listed unavailable: {disc.verdict.message}", *disc.steps]
            rep.files.append(fr)
            continue
        fr = FileRoute(
            file=script.rel,
            route=ROUTE_NAMES[disc.route],
            tools=[t.name for t in disc.tools] if disc.route == "multi-schema" else [script.name],
            why=[*disc.steps, *disc.notes],
        )
        for t in disc.tools:
            if t.kind == "unavailable":
                fr.why.append(f"unavailable: {t.reason}")
        if worker is not None:
            fr.why += [n for n in worker.discovery_notes if n.startswith(script.rel + ":")]
        rep.files.append(fr)
    registry_files = set(host.registry.files)
    for file, why in scan.skipped:
        if file in registry_files:
            continue  # the registry itself may live in the folder
        rep.files.append(FileRoute(file=file, route="not registered", why=[why]))
    for error in scan.errors:
        file = error.split(":", 1)[0]
        rep.files.append(FileRoute(file=file, route="not registered", why=[error]))
    rep.files.sort(key=lambda f: f.file)
    return rep


def folders(host: Host) -> list[FolderReport]:
    """Every ``autodiscover`` folder of the host's registry, file by file."""
    return [_folder(host, scan) for scan in scan_all(host.registry)]


def render(reports: list[FolderReport]) -> list[str]:
    """Lines for the human-readable report."""
    out: list[str] = []
    for rep in reports:
        out.append(f"autodiscover folder {rep.folder} ({AUTO_PREFIX}{rep.folder}):")
        for f in rep.files:
            tools = f" -> {', '.join(f.tools)}" if f.tools else ""
            out.append(f"       {f.file}: {f.route}{tools}")
            out.extend(f"         - {w}" for w in f.why)
    return out
