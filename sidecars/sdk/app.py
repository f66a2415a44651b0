"""The Sidecar: a program's tools registered, then served by the driver its host asks for.

# Strategy: ``Sidecar`` only collects what the program declares (tools, engines, the health
# check) and, in :meth:`Sidecar.run`, picks the driver: ``--mcp`` on the command line is the MCP
# stdio server (``sidecars.sdk.drivers.mcp_stdio``); otherwise the first line on stdin decides,
# an ``init`` message for the persistent protocol (PROTOCOL 3.1) or a ``tool`` for a single
# Flyflor request (PROTOCOL 3.2, ``drivers.oneshot``). The persistent protocol is served by
# threads (``drivers.threads``: the main thread reads, a pool runs calls) unless a tool or the
# health check is ``async def``; then one Trio loop owns the process (``drivers.trio_loop``).
# Both speak through the sidecar's :class:`~sidecars.sdk.session.Session`. Before anything is
# read, the real stdout is claimed for the protocol (``sidecars.sdk.stdio``). trio is imported
# only by sidecars with async tools (and ``--mcp``), so a sync-only sidecar starts fast.
"""

from __future__ import annotations

import inspect
import os
import sys
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, get_type_hints

import msgspec

from sidecars.sdk import engines, execution
from sidecars.sdk.context import Context
from sidecars.sdk.drivers import oneshot, threads
from sidecars.sdk.private import set_host_private
from sidecars.sdk.session import Session
from sidecars.sdk.stdio import LineReader, ProtocolOutput, fatal, log
from sidecars.sdk.tools import HealthMap, Reply, ToolError, ToolSpec
from supervisor.contracts import wire

__all__ = ["Context", "HealthFunc", "HealthMap", "Reply", "Sidecar", "ToolError", "ToolSpec"]

_json_decode = msgspec.json.decode

# ``def check(app) -> HealthMap`` or ``async def check(app) -> HealthMap``.
HealthFunc = Callable[["Sidecar"], HealthMap | Awaitable[HealthMap]]


class Sidecar:
    """A sidecar program: register tools with :meth:`tool`, then call :meth:`run`."""

    def __init__(self, name: str, *, version: str = "0.0.0", concurrency: int = 1) -> None:
        self.name = name
        self.version = version
        self.concurrency = max(1, concurrency)
        self.tools: dict[str, ToolSpec] = {}
        self.config: dict[str, Any] = {}
        self.project_dir = os.getcwd()
        self.config_dir = os.getcwd()
        self.cwd = os.getcwd()
        self.sidecar_id = os.environ.get("TOOLHOST_SIDECAR", name)
        self.health_check: HealthFunc | None = None
        """The function registered with :meth:`health` (None: every tool is healthy)."""
        self._out = ProtocolOutput()
        self.session = Session(self._out.write, self._log)
        """The process-json session with the host (calls in flight, requests out)."""
        self.engines: list[engines.Engine] = []
        self._missing: dict[str, engines.Missing] | None = None

    # registration ------------------------------------------------------------------------

    def tool(
        self,
        name: str,
        *,
        description: str,
        read_only: bool = False,
        concurrency_safe: bool = False,
        permission: str | None = None,
        sandbox: str | None = None,
        timeout_ms: int | None = None,
        requires: list[str] | None = None,
    ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Decorator registering ``func(args: InputStruct, ctx: Context)`` as tool ``name``.

        ``requires`` lists the tools a composite tool invokes through the host (manifest
        ``requires``): it is visible only while they are, and its approval covers them.

        ``func`` may be ``async def``: it then runs on the sidecar's Trio loop (see
        ``docs/sidecars.md``), and a host ``cancel`` cancels it for real.
        """

        def register(func: Callable[..., Any]) -> Callable[..., Any]:
            hints = get_type_hints(func)
            params = list(inspect.signature(func).parameters)
            if not params or params[0] not in hints:
                raise TypeError(f"tool {name}: first parameter must be annotated with a Struct")
            ret = hints.get("return")
            output_type = (
                ret
                if isinstance(ret, type) and issubclass(ret, msgspec.Struct) and ret is not Reply
                else None
            )
            self.tools[name] = ToolSpec(
                name=name,
                func=func,
                input_type=hints[params[0]],
                description=description,
                read_only=read_only,
                concurrency_safe=concurrency_safe,
                permission=permission,
                sandbox=sandbox,
                timeout_ms=timeout_ms,
                output_type=output_type,
                is_async=inspect.iscoroutinefunction(func),
                requires=list(requires) if requires else None,
            )
            return func

        return register

    def engine(self, module: str, *, install: str, tools: Iterable[str] | None = None) -> None:
        """Declare a module the tools import (lazily) and the package that provides it.

        It is imported once before ``ready``; when that fails, ``tools`` (default: every tool)
        are ``unavailable`` in ``pong`` with the import error and ``install`` as the hint, and
        their calls are answered ``unavailable`` without running (``sidecars.sdk.engines``).
        """
        self.engines.append(engines.Engine(module, install, tuple(tools) if tools else None))
        self._missing = None

    def missing_engines(self) -> dict[str, engines.Missing]:
        """Tool -> the declared engine it cannot import (checked once)."""
        if self._missing is None:
            self._missing = engines.missing(self.engines, self.tools)
        return self._missing

    def health(self, func: HealthFunc) -> HealthFunc:
        """Decorator: ``func(app)`` returns per-tool health for ``pong`` (tools absent: healthy).

        An ``async def`` health check runs as a task of the sidecar's Trio loop, which keeps
        serving calls meanwhile; the ``pong`` goes out when the check returns.
        """
        self.health_check = func
        return func

    @property
    def uses_async(self) -> bool:
        """Whether any tool or the health check is ``async def``."""
        return any(s.is_async for s in self.tools.values()) or inspect.iscoroutinefunction(
            self.health_check
        )

    def ready_message(self) -> wire.Ready:
        return wire.Ready(
            name=self.name,
            version=self.version,
            concurrency=self.concurrency,
            tools=[
                wire.ToolInfo(
                    name=spec.name,
                    description=spec.description,
                    inputSchema=spec.input_schema(),
                    outputSchema=spec.output_schema(),
                    annotations=spec.hints(),
                )
                for spec in self.tools.values()
            ],
        )

    # running -----------------------------------------------------------------------------

    def run(self) -> None:
        """Serve stdin/stdout until shutdown or EOF; exits the process when done.

        With ``--mcp`` on the command line the sidecar is an MCP stdio server instead
        (:mod:`sidecars.sdk.drivers.mcp_stdio`).
        """
        self._out.claim()
        if "--mcp" in sys.argv[1:]:
            from sidecars.sdk.drivers import mcp_stdio  # imports trio: only for the MCP mode

            mcp_stdio.serve(self, self._out.write)
            return
        reader = LineReader(sys.stdin.fileno())
        first = reader.readline()
        if not first.strip():
            return
        try:
            raw = _json_decode(first)
        except msgspec.DecodeError as exc:
            fatal(self.name, f"first line is not JSON: {exc}")
        if isinstance(raw, dict) and raw.get("type") == "init":
            try:
                init = msgspec.convert(raw, wire.Init)
            except msgspec.ValidationError as exc:
                fatal(self.name, f"invalid init message: {exc}")
            self._apply_init(init)
            self.missing_engines()  # imported before ready: the first pong already knows
            self.session.send(self.ready_message())
            if self.uses_async:
                import trio

                from sidecars.sdk.drivers import trio_loop

                trio.run(trio_loop.serve, self, reader)  # one Trio loop owns the sidecar
            else:
                threads.serve(self, reader)
        elif isinstance(raw, dict) and "tool" in raw:
            oneshot.answer(self, raw, self._out.write)
        else:
            fatal(self.name, "first line is neither an init message nor a oneshot request")

    def _apply_init(self, init: wire.Init) -> None:
        self.config = init.config
        self.project_dir = init.projectDir
        set_host_private(init.hostPrivate)
        self.config_dir = init.configDir
        self.cwd = init.cwd
        self.sidecar_id = init.sidecar

    def execute(self, tool: str, raw_input: bytes | msgspec.Raw, ctx: Context) -> wire.Result:
        """Run one tool on raw JSON input and return the wire result (id left 0).

        An async tool runs in a fresh ``trio.run`` here (oneshot mode, in-process tests); inside
        a running Trio loop use :meth:`execute_async` instead.
        """
        return execution.execute(self, tool, raw_input, ctx)

    async def execute_async(
        self, tool: str, raw_input: bytes | msgspec.Raw, ctx: Context
    ) -> wire.Result:
        """Like :meth:`execute`, awaited inside a Trio loop (sync tools go to a worker thread).

        ``trio.Cancelled`` propagates: a cancelled call has no result of its own.
        """
        return await execution.execute_async(self, tool, raw_input, ctx)

    def _log(self, level: str, message: str) -> None:
        log(self.name, level, message)
