"""Running one tool call: raw JSON input in, the tool's outcome as a wire ``Result`` out.

# Strategy: every driver (threads, Trio, MCP, oneshot) and ``Sidecar.execute`` run a tool
# through :func:`execute` (a sync caller) or :func:`execute_async` (inside a Trio loop), so the
# answers are the same whatever serves them: an unknown tool is ``unsupported``, a tool whose
# engine failed to import is ``unavailable`` without running, input msgspec cannot decode into
# the tool's Struct is ``invalid-input`` with msgspec's path-precise message, a ``ToolError``
# keeps its code, a ``ServiceError`` is ``failed`` with the service's code, and any other
# exception is ``failed`` with its type and message (its traceback goes to stderr). The result's
# ``id`` is left 0 for the driver to fill in. trio is imported only when an async tool runs.
"""

from __future__ import annotations

import sys
import traceback
from typing import Any

import msgspec

from sidecars.sdk.context import Context, SidecarView
from sidecars.sdk.services import ServiceError
from sidecars.sdk.tools import Reply, ToolError, ToolSpec
from supervisor.contracts import wire

_json_encode = msgspec.json.Encoder().encode


def execute(
    app: SidecarView, tool: str, raw_input: bytes | msgspec.Raw, ctx: Context
) -> wire.Result:
    """Run one tool on raw JSON input and return the wire result (id left 0).

    An async tool runs in a fresh ``trio.run`` here, with a nursery of its own that is
    cancelled when the tool returns (oneshot mode, in-process tests); inside a running Trio
    loop use :func:`execute_async` instead.
    """
    spec, args = _prepare(app, tool, raw_input)
    if isinstance(args, wire.Result):
        return args
    assert spec is not None
    if spec.is_async:
        import trio

        async def main() -> wire.Result:
            async with trio.open_nursery() as nursery:
                try:
                    ctx.nursery = nursery
                    return await execute_async(app, tool, raw_input, ctx)
                finally:
                    nursery.cancel_scope.cancel()

        result: wire.Result = trio.run(main)
        return result
    try:
        out = spec.func(args, ctx)
    except Exception as exc:
        return _error_result(exc)
    return _ok_result(out)


async def execute_async(
    app: SidecarView, tool: str, raw_input: bytes | msgspec.Raw, ctx: Context
) -> wire.Result:
    """Like :func:`execute`, awaited inside a Trio loop (sync tools go to a worker thread).

    ``trio.Cancelled`` propagates: a cancelled call has no result of its own.
    """
    import trio

    spec, args = _prepare(app, tool, raw_input)
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


def _prepare(
    app: SidecarView, tool: str, raw_input: bytes | msgspec.Raw
) -> tuple[ToolSpec | None, Any]:
    """The tool's spec and decoded input, or ``(spec, Result)`` answering a bad request."""
    spec = app.tools.get(tool)
    if spec is None:
        return None, wire.Result(
            id=0, ok=False, code="unsupported", error=f"{app.name} does not serve {tool}"
        )
    missing = app.missing_engines().get(tool)
    if missing is not None:
        return spec, missing.result(tool)
    try:
        return spec, msgspec.json.decode(raw_input, type=spec.input_type)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        return spec, _invalid_input(tool, spec.input_type, exc)


def _invalid_input(tool: str, input_type: Any, exc: Exception) -> wire.Result:
    """The answer to an input that does not decode: msgspec's message, and for a field the
    input does not have or lacks, the fields it takes (a model or a user guessing a name sees
    the right one in the same answer)."""
    error = f"{tool}: {exc}"
    details = None
    text = str(exc)
    if "unknown field" in text or "missing required field" in text:
        try:
            fields = msgspec.structs.fields(input_type)
        except TypeError:  # not a Struct: nothing more to say
            fields = ()
        if fields:
            names = [f.encode_name + ("" if f.required else "?") for f in fields]
            legend = "; ? = optional" if any(not f.required for f in fields) else ""
            error += f" (fields: {', '.join(names)}{legend})"
            details = {"fields": [f.encode_name for f in fields]}
    return wire.Result(id=0, ok=False, code="invalid-input", error=error, details=details)


def _error_result(exc: Exception) -> wire.Result:
    """The wire answer for an exception a tool raised (ToolError keeps its code)."""
    if isinstance(exc, ServiceError):
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
