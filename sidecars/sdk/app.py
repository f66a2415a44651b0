"""The SDK runtime: tool registration, the persistent loop and the oneshot answer.

# Strategy: the main thread only reads stdin and answers control messages (ping, cancel,
# shutdown), so a busy worker still pongs and a cancel is answered at once. Calls run on a
# thread pool sized to the advertised concurrency. Every write to the protocol stream goes
# through one lock. At start the real stdout is moved to a private descriptor and fd 1 is
# pointed at stderr, so a stray print (or a child process) can never corrupt the protocol.
# A sidecar with any ``async def`` tool is served by one Trio loop instead (``sidecars.sdk.aio``):
# async calls are tasks cancelled through their scope, sync tools still run in threads.
"""

from __future__ import annotations

import inspect
import os
import sys
import threading
import time
import traceback
from collections.abc import Awaitable, Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from typing import IO, TYPE_CHECKING, Any, cast, get_type_hints

import msgspec

from sidecars.sdk import engines, services, tracing
from sidecars.sdk.lines import LineReader
from sidecars.sdk.private import set_host_private
from supervisor.contracts import wire
from supervisor.contracts.envelope import FAILED_CODES, UNAVAILABLE_CODES

if TYPE_CHECKING:
    import trio

# trio (and ``sidecars.sdk.aio``) is imported only by sidecars with async tools, so a sync-only
# sidecar starts as fast as before.

_json_encode = msgspec.json.Encoder().encode
_json_decode = msgspec.json.decode
_DESTRUCTIVE = {None, "write", "execute", "computer"}
"""Permissions whose tools are destructive unless read-only (the MCP face's rule too)."""
CODES = wire.RESULT_CODES | UNAVAILABLE_CODES | FAILED_CODES
"""Codes a :class:`ToolError` keeps: the worker protocol's five and the envelope's (PROTOCOL 5),
so a composite tool can answer with the code of the child call that blocked it."""


class ToolError(Exception):
    """Raise from a tool to answer ``ok: false`` with a code.

    Args:
        message: Human text; becomes the envelope's ``content``.
        code: One of ``failed | unavailable | unsupported | invalid-input``, or an envelope
            code of PROTOCOL 5 (``approval-required``, ``quota-limited``, ``timeout``...);
            anything else becomes ``failed``. :meth:`passthrough` keeps any code.
        details: Structured facts for audit (paths, exit codes, provider status).
        data: Partial data that should survive the failure.
    """

    def __init__(
        self,
        message: str,
        *,
        code: str = "failed",
        details: dict[str, Any] | None = None,
        data: Any = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code if code in CODES else "failed"
        self.details = details
        self.data = data

    @classmethod
    def passthrough(
        cls,
        message: str,
        code: str | None,
        *,
        details: dict[str, Any] | None = None,
        data: Any = None,
    ) -> ToolError:
        """A composite tool's answer carrying a child call's ``error.code`` as it came (a
        sidecar's own code such as ``destination-refused`` included); the host derives the
        envelope's status from the code as it did for the child."""
        error = cls(message, details=details, data=data)
        error.code = code or "failed"
        return error


class Reply(msgspec.Struct, kw_only=True):
    """Return this to give the model a text besides the structured ``data``."""

    data: Any = None
    content: str | None = None


class Context:
    """What a tool call can see: config, anchors, cancellation and progress.

    For ``async def`` tools, :attr:`nursery` is the sidecar loop's long-lived nursery (tasks and
    connections started there outlive the call); it is ``None`` for sync tools.
    """

    def __init__(
        self,
        app: Sidecar,
        call_id: int | None,
        deadline_ms: int,
        cancelled: threading.Event,
    ) -> None:
        self.app = app
        self.call_id = call_id
        self.deadline_ms = deadline_ms
        self.cancelled = cancelled
        self.started = time.monotonic()
        self.nursery: trio.Nursery | None = None
        self._otel: Any = None
        """The OpenTelemetry context of the call's span (None: not traced)."""

    def time_left(self) -> float | None:
        """Seconds left before the call's deadline (``None`` when the call has none)."""
        if self.deadline_ms <= 0:
            return None
        return max(0.0, self.deadline_ms / 1000.0 - (time.monotonic() - self.started))

    @property
    def config(self) -> dict[str, Any]:
        return self.app.config

    @property
    def project_dir(self) -> str:
        return self.app.project_dir

    @property
    def cwd(self) -> str:
        return self.app.cwd

    def progress(self, data: Any) -> None:
        """Send a progress event for this call (ignored in oneshot mode)."""
        if self.call_id is not None and not self.cancelled.is_set():
            self.app._send(wire.Progress(id=self.call_id, data=msgspec.Raw(_json_encode(data))))

    # host services (PROTOCOL 3.5; docs/host-services.md) ---------------------------------

    def invoke(self, tool: str, input: Any, timeout_ms: int | None = None) -> Any:
        """Run another tool through the host (every gate of a kernel call applies); returns
        its envelope as an :class:`~sidecars.sdk.services.Invocation`. In an async tool,
        ``await ctx.invoke(...)``."""
        return services.invoke(self, tool, input, timeout_ms)

    def state(self, name: str) -> services.State:
        """The declared store ``name``: ``get``/``set``/``delete``/``list``."""
        return services.State(self, name)

    def vault(self, key: str) -> Any:
        """The operator's secret ``key`` (declared in the sidecar's ``vault``)."""
        return services.vault(self, key)

    def span(self, name: str, **attributes: Any) -> AbstractContextManager[Any]:
        """A span of the tool's own under this call's span (``with ctx.span("parse") as s:``).

        Without OpenTelemetry in the sidecar, or for a call the host did not trace, it yields
        a span whose methods do nothing, so tools need no ``if``.
        """
        return tracing.child_span(self._otel, name, attributes)

    def check_cancelled(self) -> None:
        """Raise :class:`ToolError` with code ``cancelled`` if the host cancelled the call.

        Sync tools poll this; async tools need not (a cancel is a real ``trio.Cancelled``).
        """
        if self.cancelled.is_set():
            raise ToolError("call cancelled", code="cancelled")


class ToolSpec(msgspec.Struct, kw_only=True):
    """A registered tool: its function, input type and manifest facts."""

    name: str
    func: Callable[..., Any]
    input_type: Any
    description: str
    read_only: bool = False
    concurrency_safe: bool = False
    permission: str | None = None
    sandbox: str | None = None
    timeout_ms: int | None = None
    output_type: Any = None
    is_async: bool = False
    requires: list[str] | None = None

    def input_schema(self) -> dict[str, Any]:
        return struct_schema(self.input_type)

    def hints(self) -> dict[str, bool]:
        """MCP-style hints: read-only, and destructive when not read-only and the permission
        is write, execute, computer or unknown (``toolhost mcp``'s rule)."""
        return {
            "readOnlyHint": self.read_only,
            "destructiveHint": (not self.read_only) and self.permission in _DESTRUCTIVE,
        }

    def output_schema(self) -> dict[str, Any] | None:
        if self.output_type is None:
            return None
        return struct_schema(self.output_type)


def struct_schema(tp: Any) -> dict[str, Any]:
    """A self-contained JSON Schema for ``tp`` with the top-level ``$ref`` inlined."""
    schema = msgspec.json.schema(tp)
    ref = schema.get("$ref")
    defs = dict(schema.get("$defs", {}))
    if isinstance(ref, str) and ref.startswith("#/$defs/"):
        name = ref.removeprefix("#/$defs/")
        root = dict(defs.pop(name))
        if defs:
            root["$defs"] = defs
        return root
    return schema


HealthMap = dict[str, wire.ToolHealth]
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
        self._health: HealthFunc | None = None
        self._out: IO[bytes] | None = None
        self._write_lock = threading.Lock()
        self._answered_lock = threading.Lock()
        self._pending: dict[int, threading.Event] = {}
        self._scopes: dict[int, trio.CancelScope] = {}  # async calls in flight (aio.serve)
        self._requests = services.Requests(self)
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

    def _health_of(self, answer: HealthMap) -> HealthMap:
        """The health map of a ``pong``: the health check's answer, engine problems first."""
        return {**answer, **{t: m.health() for t, m in self.missing_engines().items()}}

    def _health_needed(self) -> bool:
        """Whether to run the health check: not when no tool has its engines."""
        return self._health is not None and not set(self.tools) <= set(self.missing_engines())

    def health(self, func: HealthFunc) -> HealthFunc:
        """Decorator: ``func(app)`` returns per-tool health for ``pong`` (tools absent: healthy).

        An ``async def`` health check runs as a task of the sidecar's Trio loop, which keeps
        serving calls meanwhile; the ``pong`` goes out when the check returns.
        """
        self._health = func
        return func

    @property
    def uses_async(self) -> bool:
        """Whether any tool or the health check is ``async def``."""
        return any(s.is_async for s in self.tools.values()) or inspect.iscoroutinefunction(
            self._health
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
        (:mod:`sidecars.sdk.mcp`).
        """
        if "--mcp" in sys.argv[1:]:
            from sidecars.sdk import mcp  # imports trio: only for the MCP server mode

            mcp.run_mcp(self)
            return
        self._out = _claim_stdout()
        reader = LineReader(sys.stdin.fileno())
        first = reader.readline()
        if not first.strip():
            return
        try:
            raw = _json_decode(first)
        except msgspec.DecodeError as exc:
            self._fatal(f"first line is not JSON: {exc}")
            return
        if isinstance(raw, dict) and raw.get("type") == "init":
            try:
                init = msgspec.convert(raw, wire.Init)
            except msgspec.ValidationError as exc:
                self._fatal(f"invalid init message: {exc}")
                return
            self._apply_init(init)
            self.missing_engines()  # imported before ready: the first pong already knows
            self._send(self.ready_message())
            if self.uses_async:
                import trio

                from sidecars.sdk import aio

                trio.run(aio.serve, self, reader)  # one Trio loop owns the sidecar
            else:
                self._serve(reader)
        elif isinstance(raw, dict) and "tool" in raw:
            self._oneshot(raw)
        else:
            self._fatal("first line is neither an init message nor a oneshot request")

    def _apply_init(self, init: wire.Init) -> None:
        self.config = init.config
        self.project_dir = init.projectDir
        set_host_private(init.hostPrivate)
        self.config_dir = init.configDir
        self.cwd = init.cwd
        self.sidecar_id = init.sidecar

    def _serve(self, lines: Iterable[bytes]) -> None:
        """The threaded loop of sidecars whose tools are all sync (async ones: ``aio.serve``)."""
        pool = ThreadPoolExecutor(max_workers=self.concurrency, thread_name_prefix="call")
        decode = wire.host_decoder.decode
        try:
            for line in lines:
                try:
                    msg = decode(line)
                except msgspec.DecodeError as exc:
                    self._log("error", f"bad message from host: {exc}")
                    continue
                if isinstance(msg, wire.CallMessage):
                    flag = threading.Event()
                    with self._answered_lock:
                        self._pending[msg.id] = flag
                    pool.submit(self._run_call, msg, flag)
                elif isinstance(msg, wire.Ping):
                    self._send(self._pong(msg.id))
                elif isinstance(msg, wire.Cancel):
                    self._cancel(msg.id)
                elif isinstance(msg, wire.Response):
                    self._requests.resolve(msg)
                elif isinstance(msg, wire.Shutdown):
                    break
        finally:
            self._requests.fail_all("the host closed the connection")
            self._answer_pending("sidecar shutting down")
            pool.shutdown(wait=True, cancel_futures=True)

    def _answer_pending(self, why: str) -> None:
        """Every call is answered exactly once: those still pending end as cancelled."""
        with self._answered_lock:
            pending, self._pending = self._pending, {}
        for call_id, flag in pending.items():
            flag.set()
            self._send(wire.Result(id=call_id, ok=False, code="cancelled", error=why))

    def _pong(self, ping_id: str) -> wire.Pong:
        tools: dict[str, wire.ToolHealth] = {}
        status: wire.HealthStatus = "healthy"
        if self._health is not None and self._health_needed():
            try:
                tools = cast(HealthMap, self._health(self))
            except Exception as exc:
                status = "degraded"
                self._log("error", f"health check raised: {exc!r}")
        return wire.Pong(id=ping_id, status=status, tools=self._health_of(tools))

    def _cancel(self, call_id: int) -> None:
        with self._answered_lock:
            flag = self._pending.pop(call_id, None)
        if flag is None:
            return  # already answered: the host ignores anything later
        flag.set()
        scope = self._scopes.pop(call_id, None)  # an async call (then we are on its loop)
        if scope is not None:
            scope.cancel()
        self._send(wire.Result(id=call_id, ok=False, code="cancelled", error="call cancelled"))

    def _run_call(self, call: wire.CallMessage, cancelled: threading.Event) -> None:
        if cancelled.is_set():
            return
        t0 = time.thread_time()
        ctx = Context(self, call.id, call.deadlineMs, cancelled)
        result = tracing.run(
            self.name,
            call.tool,
            call.id,
            call.traceparent,
            call.tracestate,
            ctx,
            lambda: self.execute(call.tool, call.input, ctx),
        )
        result.id = call.id
        result.cpuMs = round((time.thread_time() - t0) * 1000.0, 3)
        with self._answered_lock:
            if self._pending.pop(call.id, None) is None:
                return  # cancelled meanwhile; that answer already went out
        self._send(result)

    def execute(self, tool: str, raw_input: bytes | msgspec.Raw, ctx: Context) -> wire.Result:
        """Run one tool on raw JSON input and return the wire result (id left 0).

        An async tool runs in a fresh ``trio.run`` here (oneshot mode, in-process tests); inside
        a running Trio loop use :meth:`execute_async` instead.
        """
        spec, args = self._prepare(tool, raw_input)
        if isinstance(args, wire.Result):
            return args
        assert spec is not None
        if spec.is_async:
            import trio

            from sidecars.sdk.aio import run_with_nursery

            async def main(nursery: trio.Nursery) -> wire.Result:
                ctx.nursery = nursery
                return await self.execute_async(tool, raw_input, ctx)

            result: wire.Result = trio.run(run_with_nursery, main)
            return result
        try:
            out = spec.func(args, ctx)
        except Exception as exc:
            return _error_result(exc)
        return _ok_result(out)

    async def execute_async(
        self, tool: str, raw_input: bytes | msgspec.Raw, ctx: Context
    ) -> wire.Result:
        """Like :meth:`execute`, awaited inside a Trio loop (sync tools go to a worker thread).

        ``trio.Cancelled`` propagates: a cancelled call has no result of its own.
        """
        import trio

        spec, args = self._prepare(tool, raw_input)
        if isinstance(args, wire.Result):
            return args
        assert spec is not None
        try:
            if spec.is_async:
                out = await spec.func(args, ctx)
            else:
                out = await trio.to_thread.run_sync(spec.func, args, ctx)
        except Exception as exc:
            return _error_result(exc)
        return _ok_result(out)

    def _prepare(self, tool: str, raw_input: bytes | msgspec.Raw) -> tuple[ToolSpec | None, Any]:
        """The tool's spec and decoded input, or ``(spec, Result)`` answering a bad request."""
        spec = self.tools.get(tool)
        if spec is None:
            return None, wire.Result(
                id=0, ok=False, code="unsupported", error=f"{self.name} does not serve {tool}"
            )
        missing = self.missing_engines().get(tool)
        if missing is not None:
            return spec, missing.result(tool)
        try:
            return spec, msgspec.json.decode(raw_input, type=spec.input_type)
        except (msgspec.ValidationError, msgspec.DecodeError) as exc:
            return spec, wire.Result(id=0, ok=False, code="invalid-input", error=f"{tool}: {exc}")

    def _oneshot(self, request: dict[str, Any]) -> None:
        """Answer one Flyflor request (PROTOCOL 3.2) and return; exit status 0 unless failed."""
        self.config = request.get("config") or {}
        self.project_dir = request.get("projectDir") or self.project_dir
        private = request.get("hostPrivate")
        set_host_private(private if isinstance(private, list) else [])
        self.config_dir = request.get("configDir") or self.config_dir
        self.cwd = request.get("cwd") or self.cwd
        raw_input = _json_encode(request.get("input", {}))
        tool = str(request["tool"])
        ctx = Context(self, None, 0, threading.Event())
        result = tracing.run(
            self.name,
            tool,
            None,
            os.environ.get("TRACEPARENT"),
            os.environ.get("TRACESTATE"),
            ctx,
            lambda: self.execute(tool, raw_input, ctx),
        )
        answer: dict[str, Any]
        if result.ok:
            data = _json_decode(result.data)
            answer = {**data, "ok": True} if isinstance(data, dict) else {"ok": True, "data": data}
            if result.content is not None:
                answer.setdefault("content", result.content)
        else:
            answer = {
                **(result.details or {}),
                "ok": False,
                "code": result.code,
                "error": result.error,
            }
            if result.data != wire.NULL:
                answer["data"] = _json_decode(result.data)
        self._write(_json_encode(answer) + b"\n")
        if not result.ok:
            sys.exit(1)

    # output ------------------------------------------------------------------------------

    def _send(self, msg: wire.Ready | wire.Result | wire.Progress | wire.Pong | wire.Log) -> None:
        self._write(_json_encode(msg) + b"\n")

    def _write(self, data: bytes) -> None:
        out = self._out
        if out is None:
            raise RuntimeError("Sidecar.run() has not claimed stdout")
        with self._write_lock:
            try:
                out.write(data)
                out.flush()
            except BrokenPipeError:
                os._exit(0)  # the host is gone; nobody is left to answer

    def _log(self, level: str, message: str) -> None:
        print(f"[{self.name}] {level}: {message}", file=sys.stderr, flush=True)

    def _fatal(self, message: str) -> None:
        self._log("error", message)
        sys.exit(2)


def _error_result(exc: Exception) -> wire.Result:
    """The wire answer for an exception a tool raised (ToolError keeps its code)."""
    if isinstance(exc, services.ServiceError):
        return wire.Result(
            id=0,
            ok=False,
            code="failed",
            error=str(exc),
            details={"service": exc.method, "serviceCode": exc.code},
        )
    if isinstance(exc, ToolError):
        data = msgspec.Raw(_json_encode(exc.data)) if exc.data is not None else wire.NULL
        return wire.Result(
            id=0, ok=False, code=exc.code, error=exc.message, details=exc.details, data=data
        )
    traceback.print_exception(exc, file=sys.stderr)
    return wire.Result(id=0, ok=False, code="failed", error=f"{type(exc).__name__}: {exc}")


def _ok_result(out: Any) -> wire.Result:
    """The wire answer for a tool's return value (a :class:`Reply` adds ``content``)."""
    if isinstance(out, Reply):
        return wire.Result(
            id=0, ok=True, data=msgspec.Raw(_json_encode(out.data)), content=out.content
        )
    return wire.Result(id=0, ok=True, data=msgspec.Raw(_json_encode(out)))


def _claim_stdout() -> IO[bytes]:
    """Move the protocol stream to a private fd and point fd 1 (and ``sys.stdout``) at stderr."""
    sys.stdout.flush()
    proto_fd = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return os.fdopen(proto_fd, "wb", buffering=1 << 16)
