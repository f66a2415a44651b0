"""OpenTelemetry in a sidecar: a span per tool call under the host's call span, and ``ctx.span``.

# Strategy: nothing here needs OpenTelemetry. :func:`tracer` imports it once, lazily; when it is
# not importable every helper is a no-op and a call runs exactly as before. When the host has
# telemetry on it sends the call span's W3C ``traceparent`` in each ``call`` message (oneshot and
# simple-json: ``TRACEPARENT`` in the environment) and passes ``TOOLHOST_TELEMETRY=1`` plus its
# ``OTEL_*`` settings; if the sidecar's author configured no tracer provider of their own, the
# SDK then installs one exporting over OTLP/HTTP (when ``opentelemetry-sdk`` and the exporter are
# importable), so the sidecar's spans reach the same collector as the host's. That exporter masks
# every vault value this sidecar fetched (``ctx.vault`` feeds :data:`secrets`, the host's own
# Redactor) in span names, attributes, events and status descriptions, as the host masks its own;
# a sidecar that installs its own provider exports through its own exporter, unmasked.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any

from supervisor.contracts import wire
from supervisor.policy.redact import Redactor

secrets = Redactor()
"""The vault values this sidecar was handed (``ctx.vault``): masked from every span it exports."""

_UNSET: Any = object()
_tracer: Any = _UNSET
_lock = threading.Lock()


def tracer() -> Any:
    """The SDK's tracer, or None when ``opentelemetry`` is not importable (cached)."""
    global _tracer
    if _tracer is not _UNSET:
        return _tracer
    with _lock:
        if _tracer is _UNSET:
            try:
                from opentelemetry import trace
            except ImportError:
                _tracer = None
            else:
                _configure(trace)
                _tracer = trace.get_tracer("toolhost.sidecar")
    return _tracer


def _configure(trace: Any) -> None:
    """Install an OTLP/HTTP tracer provider when the host asks and nobody configured one."""
    if os.environ.get("TOOLHOST_TELEMETRY") != "1":
        return
    if os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return
    if not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        return  # the sidecar's author set their own provider: use it
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError:
        return
    attrs = {}
    if not os.environ.get("OTEL_SERVICE_NAME"):
        attrs["service.name"] = os.environ.get("TOOLHOST_SIDECAR") or "toolhost-sidecar"
    provider = TracerProvider(resource=Resource.create(attrs))
    provider.add_span_processor(BatchSpanProcessor(_redacting(OTLPSpanExporter())))
    trace.set_tracer_provider(provider)


def conceal(value: Any) -> Any:
    """Mask ``value`` (a vault value just fetched) from every span exported from now on."""
    if isinstance(value, str):
        secrets.add(value)
    return value


def _redacting(exporter: Any) -> Any:
    """``exporter`` behind a copy of each span with :data:`secrets` masked."""
    from opentelemetry.sdk.trace import Event, ReadableSpan
    from opentelemetry.sdk.trace.export import SpanExporter
    from opentelemetry.trace import Link, Status

    def value(v: Any) -> Any:
        if isinstance(v, str):
            return secrets.text(v)
        if isinstance(v, tuple | list):
            return tuple(value(x) for x in v)
        return v

    def attrs(a: Any) -> Any:
        return {k: value(v) for k, v in a.items()} if a else a

    def masked(span: Any) -> Any:
        status = span.status
        if status.description:
            status = Status(status.status_code, secrets.text(status.description))
        return ReadableSpan(
            name=secrets.text(span.name),
            context=span.context,
            parent=span.parent,
            resource=span.resource,
            attributes=attrs(span.attributes),
            events=[
                Event(secrets.text(e.name), attrs(e.attributes), e.timestamp) for e in span.events
            ],
            links=[Link(link.context, attrs(link.attributes)) for link in span.links],
            kind=span.kind,
            status=status,
            start_time=span.start_time,
            end_time=span.end_time,
            instrumentation_scope=span.instrumentation_scope,
        )

    class Redacting(SpanExporter):
        def export(self, spans: Any) -> Any:
            if secrets:
                spans = [masked(s) for s in spans]
            return exporter.export(spans)

        def shutdown(self) -> None:
            exporter.shutdown()

        def force_flush(self, timeout_millis: int = 30000) -> bool:
            return bool(exporter.force_flush(timeout_millis))

    return Redacting()


def _wanted(traceparent: str | None) -> Any:
    """The tracer when this call should get a span: the host traced it (or has telemetry on),
    and did not drop it (a ``traceparent`` whose sampled flag is off makes no span here)."""
    if traceparent is None:
        if os.environ.get("TOOLHOST_TELEMETRY") != "1":
            return None
    elif traceparent.endswith("-00"):
        return None
    return tracer()


def _parent(traceparent: str | None, tracestate: str | None) -> Any:
    if not traceparent:
        return None
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    carrier = {"traceparent": traceparent}
    if tracestate:
        carrier["tracestate"] = tracestate
    return TraceContextTextMapPropagator().extract(carrier)


def _start(t: Any, app_name: str, tool: str, call_id: int | None, parent: Any) -> Any:
    from opentelemetry.trace import SpanKind

    attrs: dict[str, Any] = {"gen_ai.tool.name": tool, "toolhost.sidecar": app_name}
    if call_id is not None:
        attrs["toolhost.call.id"] = call_id
    return t.start_span(f"tool {tool}", context=parent, kind=SpanKind.INTERNAL, attributes=attrs)


def _end(span: Any, result: wire.Result | None) -> None:
    from opentelemetry.trace import Status, StatusCode

    if result is None:
        span.set_attribute("error.type", "cancelled")
        span.set_status(Status(StatusCode.ERROR, "cancelled"))
    elif not result.ok:
        span.set_attribute("error.type", result.code or "failed")
        span.set_status(Status(StatusCode.ERROR, secrets.text(result.error or "")[:512]))
    span.end()


def run(
    app_name: str,
    tool: str,
    call_id: int | None,
    traceparent: str | None,
    tracestate: str | None,
    ctx: Any,
    body: Callable[[], wire.Result],
) -> wire.Result:
    """Run ``body`` (a sync call) inside the tool's span, when there is one to make."""
    t = _wanted(traceparent)
    if t is None:
        return body()
    from opentelemetry import trace

    span = _start(t, app_name, tool, call_id, _parent(traceparent, tracestate))
    ctx.otel_context = trace.set_span_in_context(span)
    result: wire.Result | None = None
    try:
        with trace.use_span(span, end_on_exit=False):
            result = body()
        return result
    finally:
        _end(span, result)


async def run_async(
    app_name: str,
    tool: str,
    call_id: int | None,
    traceparent: str | None,
    tracestate: str | None,
    ctx: Any,
    body: Callable[[], Awaitable[wire.Result]],
) -> wire.Result:
    """:func:`run` for a call awaited on the sidecar's Trio loop."""
    t = _wanted(traceparent)
    if t is None:
        return await body()
    from opentelemetry import trace

    span = _start(t, app_name, tool, call_id, _parent(traceparent, tracestate))
    ctx.otel_context = trace.set_span_in_context(span)
    result: wire.Result | None = None
    try:
        with trace.use_span(span, end_on_exit=False):
            result = await body()
        return result
    finally:
        _end(span, result)


class NoSpan:
    """What ``ctx.span`` yields without OpenTelemetry: every span method is a no-op."""

    def set_attribute(self, key: str, value: Any) -> None:
        pass

    def add_event(self, name: str, attributes: dict[str, Any] | None = None) -> None:
        pass

    def is_recording(self) -> bool:
        return False


@contextmanager
def child_span(parent: Any, name: str, attributes: dict[str, Any]) -> Iterator[Any]:
    """A span of the tool's own under the call's span (``ctx.span``); :class:`NoSpan` when
    OpenTelemetry is absent or the call is not traced."""
    t = tracer() if parent is not None else None
    if t is None:
        yield NoSpan()
        return
    with t.start_as_current_span(name, context=parent, attributes=attributes) as span:
        yield span
