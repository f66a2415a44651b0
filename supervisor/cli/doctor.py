"""``toolhost doctor``: start each configured sidecar once, probe it, and say what is wrong.

Works without a running host (it runs its own, without a socket and without restarts). Exit
status is non-zero when a configured, enabled sidecar is unavailable.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import msgspec
import trio

from supervisor.cli import doctor_confine, doctor_folders
from supervisor.cli.common import EXIT_FAILED, EXIT_OK, app_root
from supervisor.cli.render import shadowed_lines, zygote_text
from supervisor.contracts.snapshot import Descriptor
from supervisor.host.host import Host, build_host
from supervisor.host.loading import HostOptions
from supervisor.processes import zygote
from supervisor.processes.warden import process_warden


class SidecarReport(msgspec.Struct, kw_only=True):
    id: str
    ok: bool
    state: str
    problems: list[str] = msgspec.field(default_factory=list)
    hints: list[str] = msgspec.field(default_factory=list)
    stderr: str = ""
    tools: dict[str, str] = msgspec.field(default_factory=dict)
    confinement: doctor_confine.ConfineReport | None = None
    """Its profile, what the plan enforces and what its worker has (PROTOCOL 7)."""
    shadowed: list[dict[str, str]] = msgspec.field(default_factory=list)
    """What of this MCP sidecar another sidecar owns: ``{kind, name, shadowedBy}``."""


class Report(msgspec.Struct, kw_only=True):
    ok: bool
    registry: list[str]
    registry_problems: list[str]
    registry_unusable: list[str] = msgspec.field(default_factory=list)
    """Registry files that exist (or were named) but cannot be used: why is in the problems."""
    sidecars: list[SidecarReport]
    tools: list[dict[str, Any]]
    zygote: str = ""
    """One line: the zygote's state, or why it is unavailable (docs/zygote.md)."""
    folders: list[doctor_folders.FolderReport] = msgspec.field(default_factory=list)
    """Each ``autodiscover`` folder, file by file: its route, or why it is not a tool."""


def _settled(host: Host) -> bool:
    for pool in host.pools.values():
        s = pool.statistics()
        if s.ever_ready and any(w.state == "ready" for w in s.workers):
            continue
        if s.last_exit is not None and s.places == 0:
            continue
        return False
    return True


async def examine(options: HostOptions, timeout_s: float) -> Report:
    """Run a host until every sidecar is ready or has failed once; return the findings."""
    host = await build_host(options)
    async with trio.open_nursery() as nursery:
        await nursery.start(host.run)
        limit = timeout_s
        for sp in host.plan.sidecars.values():
            if sp.config is not None:
                limit = max(limit, sp.config.probe.start_timeout_ms / 1000.0 + 2.0)
        with trio.move_on_after(limit):
            while not _settled(host):
                await host.feed.wait_change()
        report = _report(host)
        host.stop()
        with trio.move_on_after(10):
            await host.wait_stopped()
        nursery.cancel_scope.cancel()
    return report


def _report(host: Host) -> Report:
    tools_by_sidecar: dict[str, list[Descriptor]] = {}
    for d in host.catalog.tools():
        tools_by_sidecar.setdefault(d.sidecar or "", []).append(d)
    sidecars = []
    all_ok = True
    for sid, sp in sorted(host.plan.sidecars.items()):
        cfg = sp.config
        descs = tools_by_sidecar.get(sid, [])
        rep = SidecarReport(id=sid, ok=True, state="ready")
        pool = host.pools.get(sid)
        for d in descs:
            rep.tools[d.name] = d.stability.effective
            for r in d.stability.reasons:
                line = f"{d.name}: {r.field} {r.code}: {r.message}"
                if line not in rep.problems:
                    rep.problems.append(line)
                if r.hint and r.hint not in rep.hints:
                    rep.hints.append(r.hint)
        if cfg is None:
            rep.ok, rep.state = False, "invalid"
            for e in sp.entry.errors:
                if e not in rep.problems:
                    rep.problems.insert(0, e)
        elif not cfg.enabled:
            rep.state = "disabled"
        elif pool is None:
            rep.ok = False
            rep.state = "not started"
            if sp.problem:
                rep.problems.insert(0, sp.problem)
        else:
            facts = pool.facts()
            rep.state = facts.runtime
            if facts.runtime != "ready" or (
                descs and all(d.stability.effective == "unavailable" for d in descs)
            ):
                rep.ok = False
            rep.stderr = pool.stderr_tail(2048).strip()
            rep.shadowed = host.views.shadowed(sid, pool.status().tools)
        rep.problems.extend(sp.entry.warnings)
        rep.confinement = doctor_confine.report(host, sid, rep.stderr if not rep.ok else "")
        if not rep.ok:
            all_ok = False
        sidecars.append(rep)
    registry_problems = [*host.registry.errors, *host.known.errors]
    return Report(
        ok=all_ok and not registry_problems,  # a problem in a file is a failure too
        registry=list(host.registry.files),
        registry_problems=registry_problems,
        registry_unusable=list(host.registry.unusable),
        sidecars=sidecars,
        tools=[
            {"name": d.name, "effective": d.stability.effective, "sidecar": d.sidecar}
            for d in host.catalog.tools()
        ],
        zygote=_zygote_line(host),
        folders=doctor_folders.folders(host),
    )


def _zygote_line(host: Host) -> str:
    z = host.zygote
    if z is None:
        if not host.registry.host.zygote.enabled:
            return "zygote: off (host.zygote.enabled is false); every worker is exec'd"
        if zygote.forced_exec():
            return "zygote: off (TOOLHOST_SPAWN=exec); every worker is exec'd"
        return "zygote: off; every worker is exec'd"
    line = zygote_text(z.status())
    if z.state != "ready":
        line += "; workers are exec'd meanwhile (slower starts, more memory)"
    return line


def render(report: Report) -> str:
    files = [*report.registry, *(f"{f} (not usable: see below)" for f in report.registry_unusable)]
    out = [f"registry: {', '.join(files) or 'none found (run `toolhost init`)'}"]
    for p in report.registry_problems:
        out.append(f"  ! {p}")
    for s in report.sidecars:
        mark = "ok" if s.ok else ("--" if s.state == "disabled" else "FAIL")
        out.append(f"[{mark}] sidecar {s.id}: {s.state}")
        for name, eff in sorted(s.tools.items()):
            out.append(f"       {name}: {eff}")
        if s.confinement is not None:
            out.extend(doctor_confine.render(s.confinement))
        out.extend(f"     {line}" for line in shadowed_lines(s.id, s.shadowed))
        for p in s.problems:
            out.append(f"     problem: {p}")
        for h in s.hints:
            out.append(f"     fix: {h}")
        if s.stderr and not s.ok:
            tail = "\n".join("       | " + line for line in s.stderr.splitlines()[-8:])
            out.append("     stderr (last lines):\n" + tail)
    out.extend(doctor_folders.render(report.folders))
    missing = [t for t in report.tools if t["sidecar"] is None]
    if missing:
        out.append("not installed (known tools no sidecar serves):")
        out.extend(f"       {t['name']}" for t in missing)
    if report.zygote:
        out.append(report.zygote)
    if report.ok:
        out.append("all configured sidecars are healthy")
    elif report.registry_problems and all(s.ok for s in report.sidecars):
        out.append("the registry or manifest files have problems (listed with `!` above)")
    else:
        out.append("some sidecars are unavailable")
    return "\n".join(out)


def run(args: argparse.Namespace) -> int:
    options = HostOptions(
        app_root=app_root(args),
        registry_path=args.registry,
        use_global=not args.no_global,
        restart_policy="never",
        audit=False,
    )
    try:
        report = trio.run(examine, options, args.timeout)
    finally:
        process_warden().close()
    if args.json:
        sys.stdout.write(json.dumps(msgspec.to_builtins(report), indent=2) + "\n")
    else:
        print(render(report))
    return EXIT_OK if report.ok else EXIT_FAILED
