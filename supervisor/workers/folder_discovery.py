"""What a simple-json folder offers (PROTOCOL 3.3): its tools, their health and how to call
each, found by asking its scripts.

# Strategy: before a simple-json worker is ready, every distinct script of the folder goes
# through discovery (:func:`supervisor.workers.discovery.discover`: the simple-json probe, then
# the Fractalic schema dumps and ``--help``), two at a time, each step on the probe deadline;
# every CLI manifest without ``parameters`` has its ``--help`` read for a schema. The answers
# become one :class:`FolderTools`: the tool list of the worker's ``ready`` message, a health
# entry per tool (an unusable script is an ``unavailable`` tool that says what every step
# found), the routes of the tools discovery found (a multi-tool script's tools, CLI entries), and
# what each script answered, for ``toolhost doctor``. The processes are run by the caller
# (``run``), so this module decides only what the answers mean.
"""

from __future__ import annotations

import os

import trio

from supervisor.contracts import wire
from supervisor.contracts.registry import TOOL_NAME_PATTERN
from supervisor.protocols import fractalic_yaml, simple_json
from supervisor.protocols.fractalic_discovery import MULTI_SCHEMA_ARG, Discovery, FoundTool
from supervisor.workers import discovery
from supervisor.workers.base import LaunchSpec

PROBE_PARALLEL = 2
"""Discovery probes run at once (each is timed from its own spawn)."""


class FolderTools:
    """What discovery found in one folder."""

    def __init__(self) -> None:
        self.tools: dict[str, wire.ToolInfo] = {}
        """Every tool of the folder, by name (the ``ready`` message's list)."""
        self.health: dict[str, wire.ToolHealth] = {}
        """Each tool's health (the discovery ``pong``)."""
        self.routes: dict[str, fractalic_yaml.Route] = {}
        """Tools discovery found (multi-schema, schema dump, --help) and how to call them."""
        self.discoveries: dict[str, Discovery] = {}
        """What discovery found for each script (by its path for messages), for the doctor."""
        self.notes: list[str] = []
        """Tools a multi-tool script published that another tool of the folder already had."""


def _display(argv: list[str], cwd: str) -> str:
    """The script of an argv, relative to the sidecar's cwd (for messages)."""
    return os.path.relpath(argv[-1], cwd) if argv else "?"


async def discover_folder(spec: LaunchSpec, run: discovery.Runner) -> FolderTools:
    """Ask every script of the folder ``spec`` describes what it offers.

    Args:
        spec: The folder's worker spec (``scripts``, ``routes``, the probe timeout).
        run: Runs one introspection command line within the probe deadline.
    """
    scripts = spec.scripts
    ms = int(spec.probe_timeout_s * 1000)
    found: dict[str, Discovery] = {}
    helps: dict[str, FoundTool] = {}
    limiter = trio.CapacityLimiter(PROBE_PARALLEL)

    async def discover(key: str, name: str, argv: list[str]) -> None:
        async with limiter:
            found[key] = await discovery.discover(
                run,
                argv,
                name=name,
                where=_display(argv, spec.cwd),
                timeout_ms=ms,
                name_pattern=TOOL_NAME_PATTERN,
                multi=spec.announces,
            )

    async def read_help(name: str, argv: list[str]) -> None:
        async with limiter:
            got = await discovery.read_help(
                run, argv, name=name, where=_display(argv, spec.cwd), timeout_ms=ms
            )
            if got is not None:
                helps[name] = got

    unique: dict[str, tuple[str, list[str]]] = {}
    for name, argv in scripts.items():
        unique.setdefault("\0".join(argv), (name, argv))
    async with trio.open_nursery() as nursery:
        for key, (name, argv) in unique.items():
            nursery.start_soon(discover, key, name, argv)
        for name, route in spec.routes.items():
            # A CLI manifest without ``parameters``: the schema comes from --help.
            if route.kind == "cli" and route.parameters is None:
                nursery.start_soon(read_help, name, route.argv)
    out = FolderTools()
    tools, health = out.tools, out.health
    for name, route in spec.routes.items():
        helped = helps.get(name)
        schema = route.parameters or (helped.schema if helped else dict(simple_json.ANY_OBJECT))
        tools[name] = wire.ToolInfo(name=name, description=route.description, inputSchema=schema)
        if route.kind == "unavailable":
            health[name] = wire.ToolHealth(
                status="unavailable", code=route.code, reason=route.reason, hint=route.hint
            )
        else:
            health[name] = wire.ToolHealth(status="healthy")
    # Names a multi-tool script may not take (it may take its own: it is no tool itself).
    taken = set(tools) | {
        n for n, argv in scripts.items() if found["\0".join(argv)].route != "multi-schema"
    }
    for name, argv in scripts.items():
        where = _display(argv, spec.cwd)
        disc = found["\0".join(argv)]
        out.discoveries[where] = disc
        if disc.route == "multi-schema":
            _add_multi(out, where, disc, taken)
            continue
        if disc.route != "none":
            tool = disc.tools[0]
            if tool.kind != "simple-json":  # simple-json: called as the script it is
                out.routes[name] = fractalic_yaml.Route(kind="cli", argv=list(tool.argv))
            tools[name] = wire.ToolInfo(
                name=name, description=tool.description, inputSchema=tool.schema
            )
            health[name] = wire.ToolHealth(status="healthy")
            continue
        verdict = disc.verdict
        tools[name] = simple_json.tool_info(name, None, f"simple-json script {where}")
        health[name] = wire.ToolHealth(
            status="unavailable",
            code=verdict.code,
            reason=f"{where}: {verdict.message}",
            hint="make the script answer "
            f"{simple_json.TEST_ARG} with JSON quickly, or raise the probe timeout "
            "(autodiscover probeTimeoutMs / sidecars.<id>.probe.timeoutMs); "
            "`toolhost doctor` shows every discovery step",
        )
    return out


def _add_multi(out: FolderTools, where: str, disc: Discovery, taken: set[str]) -> None:
    """A multi-tool script's tools (each called with its name as the first argument)."""
    for tool in disc.tools:
        if tool.name in taken:
            out.notes.append(
                f"{where}: {tool.name} is already a tool of this folder; not registered"
            )
            continue
        taken.add(tool.name)
        out.tools[tool.name] = wire.ToolInfo(
            name=tool.name, description=tool.description, inputSchema=tool.schema
        )
        if tool.kind == "unavailable":
            out.routes[tool.name] = fractalic_yaml.Route(
                kind="unavailable", argv=list(tool.argv), reason=tool.reason
            )
            out.health[tool.name] = wire.ToolHealth(
                status="unavailable",
                code="multi-schema-invalid",
                reason=tool.reason,
                hint=f"fix the entry in the script's {MULTI_SCHEMA_ARG} answer",
            )
            continue
        kind: fractalic_yaml.RouteKind = "simple-json" if tool.kind == "simple-json" else "cli"
        out.routes[tool.name] = fractalic_yaml.Route(kind=kind, argv=list(tool.argv))
        out.health[tool.name] = wire.ToolHealth(status="healthy")
