"""The simple-json worker (PROTOCOL 3.3): a folder of scripts and CLI tools, one process per call.

# Strategy: a :class:`~supervisor.workers.per_call.PerCallWorker` that is ready once discovery
# (:mod:`supervisor.workers.folder_discovery`) has asked every script of its folder what it
# offers; the tool list and each tool's health are its ``ready`` message and first probe. A call
# runs the tool's route: a simple-json script gets the input JSON as its one argument and its
# whole stdout is the answer (:func:`~supervisor.protocols.simple_json.parse_answer`); a CLI tool
# (``*.yaml`` manifest, or found by ``--help``) gets the input as flags and its stdout is the
# answer (:func:`~supervisor.protocols.fractalic_yaml.parse_cli_answer`).
"""

from __future__ import annotations

import msgspec
import trio

from supervisor.contracts import wire
from supervisor.protocols import fractalic_yaml, simple_json
from supervisor.protocols.fractalic_discovery import Discovery
from supervisor.protocols.outcome import CallOutcome
from supervisor.workers import discovery
from supervisor.workers.base import LaunchSpec, WorkerHooks
from supervisor.workers.folder_discovery import discover_folder
from supervisor.workers.per_call import Invocation, PerCallWorker, ProcessRun, SpawnFailed


class SimpleJsonWorker(PerCallWorker):
    """simple-json scripts: discovered at start, then one run per call with the input as argv
    (or as flags, for CLI tools)."""

    def __init__(self, spec: LaunchSpec, hooks: WorkerHooks, index: int = 0) -> None:
        super().__init__(spec, hooks, index)
        self.found_routes: dict[str, fractalic_yaml.Route] = {}
        """Tools discovery found (multi-schema, schema dump, --help) and how to call them."""
        self.discoveries: dict[str, Discovery] = {}
        """What discovery found for each script (by its path for messages), for the doctor."""
        self.discovery_notes: list[str] = []
        """Tools a multi-tool script published that another tool of the folder already had."""

    async def _startup(self) -> None:
        found = await discover_folder(self.spec, self._introspect)
        self.found_routes = found.routes
        self.discoveries = found.discoveries
        self.discovery_notes = found.notes
        self.ready_msg = wire.Ready(
            name=self.sidecar, concurrency=self.concurrency, tools=list(found.tools.values())
        )
        self.hooks.on_pong(self, wire.Pong(id="discovery", status="healthy", tools=found.health))

    async def _introspect(self, argv: list[str]) -> discovery.Ran | None:
        """One discovery run within the probe deadline (None: timed out)."""
        run: ProcessRun | None = None
        try:
            with trio.move_on_after(self.spec.probe_timeout_s):
                run = await self.run_process(argv, None, first_line=False)
        except SpawnFailed as exc:
            raise discovery.CannotRun(str(exc)) from exc
        if run is None:
            return None
        return discovery.Ran(output=run.output, exit_code=run.exit_code, stderr=run.stderr)

    def _invocation(self, tool: str, input_raw: msgspec.Raw) -> Invocation | CallOutcome:
        route = self.spec.routes.get(tool) or self.found_routes.get(tool)
        if route is None:
            argv = self.spec.scripts.get(tool)
            if argv is None:
                return CallOutcome(
                    ok=False, code="unsupported", error=f"{self.sidecar} has no script for {tool}"
                )
            return _script(tool, argv, input_raw)
        if route.kind == "unavailable":
            return CallOutcome(ok=False, code="unavailable", error=route.reason)
        if route.kind == "simple-json":
            return _script(tool, route.argv, input_raw)
        try:
            flags = fractalic_yaml.cli_args(msgspec.json.decode(bytes(input_raw)))
        except msgspec.DecodeError:
            flags = "the input is not JSON"
        if isinstance(flags, str):
            return CallOutcome(ok=False, code="invalid-input", error=f"{tool}: {flags}")
        return Invocation([*route.argv, *flags], None, False, fractalic_yaml.parse_cli_answer)


def _script(tool: str, argv: list[str], input_raw: msgspec.Raw) -> Invocation | CallOutcome:
    """A simple-json script's call: the input JSON as its last argument."""
    try:
        full = simple_json.call_argv(argv, bytes(input_raw))
    except UnicodeDecodeError:
        return CallOutcome(ok=False, code="invalid-input", error=f"{tool}: input is not UTF-8")
    return Invocation(full, None, False, simple_json.parse_answer)
