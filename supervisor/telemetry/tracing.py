"""The host's spans: a SERVER span per kernel request, an ``execute_tool`` span per call.

# Strategy: one :class:`Tracing` per host owns its own ``TracerProvider`` (never the global one,
# so several hosts in one process, as in the tests, keep their own settings) with a batch span
# processor and the OTLP/HTTP exporter, both configured by the standard ``OTEL_*`` variables.
# A call's span lives in a :class:`CallTrace` the invoker keeps on ``call.trace``: the call path
# only calls its methods (queued, sent, retry, progress, cancel, finished), and workers read its
# W3C ``traceparent`` for the ``call`` message, ``params._meta`` (MCP) or ``TRACEPARENT``
# (oneshot, simple-json). Span names and attributes follow the OpenTelemetry GenAI and MCP
# semantic conventions (docs/telemetry.md lists them). This module sees a call only as a
# :class:`TracedCall` (and an attempt's outcome as an :class:`AttemptOutcome`): telemetry sits
# below the call path and imports none of it.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any, Protocol

import msgspec
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.sampling import ALWAYS_ON
from opentelemetry.trace import Span, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

import supervisor
from supervisor.contracts.envelope import Envelope
from supervisor.telemetry.metering import Metering, QueueDepth
from supervisor.telemetry.sampling import (
    Sampling,
    new_trace_id,
    parse_traceparent,
    unsampled_traceparent,
)

log = logging.getLogger("toolhost.telemetry")

SCOPE = "toolhost"
SHUTDOWN_TIMEOUT_MS = 3000
_PROPAGATOR = TraceContextTextMapPropagator()


def traceparent_of(span: Span) -> tuple[str, str | None]:
    """The W3C ``traceparent`` (and ``tracestate``, None when empty) naming ``span``."""
    sc = span.get_span_context()
    parent = f"00-{sc.trace_id:032x}-{sc.span_id:016x}-{int(sc.trace_flags):02x}"
    state = sc.trace_state.to_header() if sc.trace_state else ""
    return parent, state or None


def context_from(traceparent: str | None, tracestate: str | None = None) -> Context | None:
    """The parent context a W3C header pair names (None: absent; an invalid one is ignored,
    as W3C Trace Context says, and the span starts a new trace)."""
    if not traceparent:
        return None
    carrier = {"traceparent": traceparent}
    if tracestate:
        carrier["tracestate"] = tracestate
    return _PROPAGATOR.extract(carrier)


class Unsampled:
    """The parent of a span the sampler dropped: its trace id, no span object at all."""

    __slots__ = ("trace_id", "tracestate")

    def __init__(self, trace_id: int, tracestate: str | None = None) -> None:
        self.trace_id = trace_id
        self.tracestate = tracestate


Parent = Context | Unsampled
"""Where a new span goes: under a sampled span (an OpenTelemetry context), or dropped."""


class AttemptOutcome(Protocol):
    """What a span reads of one attempt's outcome (``supervisor.calls.call.CallOutcome``)."""

    @property
    def ok(self) -> bool: ...

    @property
    def code(self) -> str | None: ...

    @property
    def error(self) -> str | None: ...


class TracedCall(Protocol):
    """What a span reads of a call (``supervisor.calls.call.Call``)."""

    @property
    def id(self) -> int: ...

    @property
    def tool(self) -> str: ...

    @property
    def sidecar(self) -> str: ...

    @property
    def t0(self) -> float: ...

    @property
    def input_raw(self) -> msgspec.Raw: ...

    @property
    def parent(self) -> TracedCall | None: ...

    @property
    def trace(self) -> CallTrace | None: ...


class CallTrace:
    """The ``execute_tool`` span of one call and what its workers propagate.

    Attributes:
        span: The call's span; None when the sampler dropped the call (then only
            :attr:`traceparent` exists, with the sampled flag off).
        traceparent: W3C ``traceparent`` sent to workers.
        tracestate: W3C ``tracestate`` (None when empty).
    """

    __slots__ = (
        "client",
        "live",
        "owner",
        "queue_ms",
        "recording",
        "span",
        "t0",
        "trace_id",
        "traceparent",
        "tracestate",
    )

    def __init__(
        self,
        owner: Tracing,
        span: Span | None,
        t0: float,
        trace_id: int = 0,
        tracestate: str | None = None,
    ) -> None:
        self.owner = owner
        self.span = span
        self.t0 = t0
        self.queue_ms: float | None = None
        self.client: Span | None = None
        """The current attempt's MCP client span (MCP workers), ended with the attempt."""
        self.live = span if span is not None and span.is_recording() else None
        """The span when it records (events go there), else None."""
        if span is None:
            self.recording = False
            self.trace_id = trace_id
            self.traceparent = unsampled_traceparent(trace_id)
            self.tracestate = tracestate
        else:
            self.recording = span.is_recording()
            self.trace_id = span.get_span_context().trace_id
            self.traceparent, self.tracestate = traceparent_of(span)

    def log_ids(self) -> tuple[str, str] | None:
        """``(trace_id, span_id)`` in hex for log records, when the call's span is sampled."""
        span = self.live
        if span is None:
            return None
        sc = span.get_span_context()
        return f"{sc.trace_id:032x}", f"{sc.span_id:016x}"

    def as_parent(self) -> Parent:
        """Where this call's children go (a child call's span, an MCP client span)."""
        if self.span is None:
            return Unsampled(self.trace_id, self.tracestate)
        return trace.set_span_in_context(self.span)

    def mcp_client(self, call: TracedCall, transport: str, session_id: str | None = None) -> str:
        """Open the MCP CLIENT span of this attempt; its ``traceparent`` (for ``_meta``)."""
        return self.owner.mcp_client_span(call, transport, session_id)

    def queued(self, depth: int) -> None:
        """The call waits in its pool's queue (``depth`` calls wait before it)."""
        live = self.live
        if live is not None:
            live.add_event("queued", {"toolhost.queue.depth": depth})

    def sent(self, pid: int | None, attempt: int, now: float) -> None:
        """An attempt was handed to a worker."""
        live = self.live
        if live is None:
            return
        if self.queue_ms is None:
            self.queue_ms = round((now - self.t0) * 1000.0, 3)
        attrs: dict[str, Any] = {"toolhost.attempt": attempt}
        if pid is not None:
            attrs["toolhost.worker.pid"] = pid
        live.add_event("sent to worker", attrs)

    def retry(self, code: str | None, delay_ms: float) -> None:
        """The attempt failed and the call waits ``delay_ms`` before the next one."""
        live = self.live
        if live is not None:
            live.add_event(
                "retry", {"error.type": code or "failed", "toolhost.retry.delay_ms": delay_ms}
            )

    def progress(self) -> None:
        """The worker reported progress."""
        live = self.live
        if live is not None:
            live.add_event("progress")

    def cancelled(self, message: str) -> None:
        """``tools.cancel``, a client that left, or a parent that ended."""
        live = self.live
        if live is not None:
            live.add_event("cancel", {"toolhost.cancel.reason": message or "cancelled"})

    def attempt_ended(self, outcome: AttemptOutcome | None) -> None:
        """End the attempt's MCP client span, if any (``outcome`` None: abandoned)."""
        client = self.client
        if client is None:
            return
        self.client = None
        if outcome is None:
            client.set_attribute("error.type", "cancelled")
            client.set_status(Status(StatusCode.ERROR, "abandoned"))
        elif not outcome.ok:
            client.set_attribute("error.type", outcome.code or "failed")
            client.set_status(Status(StatusCode.ERROR, outcome.error or ""))
        client.end()


class Tracing:
    """Spans and metrics of one host (see the module docstring).

    Args:
        provider: The host's own tracer provider.
        metering: Its meter provider and instruments.
        sampling: The sampling rule (decided here when it is a standard one).
        capture_content: Record inputs and outputs as span attributes (opt-in).
        endpoint: Where OTLP goes (for the log line).
        redact: Masks vault values out of captured content (the host's redactor).
    """

    def __init__(
        self,
        provider: TracerProvider,
        metering: Metering,
        sampling: Sampling,
        *,
        capture_content: bool = False,
        endpoint: str = "",
        redact: Callable[[str], str] = lambda text: text,
    ) -> None:
        self.provider = provider
        self.tracer = provider.get_tracer(SCOPE, supervisor.__version__)
        self.metering = metering
        self.sampling = sampling
        self.capture_content = capture_content
        self.endpoint = endpoint
        self.redact = redact

    @classmethod
    def from_env(
        cls,
        *,
        capture_content: bool = False,
        redact: Callable[[str], str] = lambda text: text,
        queue_depth: QueueDepth = lambda: (),
    ) -> Tracing:
        """A provider, batch processor and OTLP/HTTP exporter set by the ``OTEL_*`` variables
        (``OTEL_SERVICE_NAME`` defaults to ``toolhost``; the sampler to parent-based on).
        ``redact`` masks captured content; ``queue_depth`` feeds the queue-depth gauge."""
        attrs: dict[str, Any] = {"service.version": supervisor.__version__}
        if not os.environ.get("OTEL_SERVICE_NAME"):
            attrs["service.name"] = "toolhost"
        resource = Resource.create(attrs)
        sampling = Sampling()
        provider = TracerProvider(
            resource=resource,
            sampler=ALWAYS_ON if sampling.fast else None,  # fast: decided before the SDK
            shutdown_on_exit=False,
        )
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        endpoint = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or os.environ.get(
            "OTEL_EXPORTER_OTLP_ENDPOINT", "http://localhost:4318"
        )
        return cls(
            provider,
            Metering.from_env(resource, queue_depth),
            sampling,
            capture_content=capture_content,
            endpoint=endpoint,
            redact=redact,
        )

    def _open(
        self,
        name: str,
        kind: SpanKind,
        attrs: dict[str, Any],
        traceparent: str | None,
        tracestate: str | None,
    ) -> tuple[Span | None, Parent]:
        """A span under the caller's ``traceparent``, or None when it is not sampled; and
        where the spans under it go."""
        parsed = parse_traceparent(traceparent) if traceparent else None
        sampling = self.sampling
        if sampling.fast:
            trace_id = parsed[0] if parsed is not None else new_trace_id()
            if not sampling.decide(trace_id, parsed[2] if parsed is not None else None):
                return None, Unsampled(trace_id, tracestate if parsed is not None else None)
        parent = context_from(traceparent, tracestate) if parsed is not None else None
        span = self.tracer.start_span(name, context=parent, kind=kind, attributes=attrs)
        return span, trace.set_span_in_context(span)

    # kernel requests -------------------------------------------------------------------------

    def request_span(
        self,
        method: str,
        traceparent: str | None,
        tracestate: str | None,
        *,
        request_id: Any,
        tool: str | None = None,
        client: str = "",
    ) -> tuple[Span | None, Parent]:
        """The SERVER span of one kernel request, a child of the request's ``trace`` (None
        when not sampled), and where its call's span goes."""
        attrs: dict[str, Any] = {
            "rpc.system": "jsonrpc",
            "rpc.method": method,
            "jsonrpc.request.id": str(request_id),
        }
        if tool is not None:
            attrs["gen_ai.tool.name"] = tool
        if client:
            attrs["toolhost.client"] = client
        return self._open(method, SpanKind.SERVER, attrs, traceparent, tracestate)

    def mcp_server_span(
        self,
        tool: str,
        traceparent: str | None,
        tracestate: str | None,
        *,
        request_id: Any,
        session_id: str | None,
        transport: str,
        protocol_version: str | None = None,
    ) -> tuple[Span | None, str | None, str | None]:
        """The MCP SERVER span of one ``tools/call`` (MCP semantic conventions; None when not
        sampled) and the ``traceparent``/``tracestate`` its kernel request carries."""
        attrs: dict[str, Any] = {
            "mcp.method.name": "tools/call",
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": tool,
            "jsonrpc.request.id": str(request_id),
            "network.transport": transport,
        }
        if session_id:
            attrs["mcp.session.id"] = session_id
        if protocol_version:
            attrs["mcp.protocol.version"] = protocol_version
        span, parent = self._open(
            f"tools/call {tool}", SpanKind.SERVER, attrs, traceparent, tracestate
        )
        if span is None:
            assert isinstance(parent, Unsampled)
            return None, unsampled_traceparent(parent.trace_id), parent.tracestate
        tp, ts = traceparent_of(span)
        return span, tp, ts

    @staticmethod
    def end_span(span: Span | None, error_type: str | None = None, message: str = "") -> None:
        """End a request span; ``error_type`` set: it failed (``error.type``, status ERROR)."""
        if span is None:
            return
        if error_type is not None:
            span.set_attribute("error.type", error_type)
            span.set_status(Status(StatusCode.ERROR, message[:512]))
        span.end()

    # calls ------------------------------------------------------------------------------------

    def call_started(self, call: TracedCall, parent: Parent | None) -> CallTrace:
        """Open the call's ``execute_tool`` span (under ``parent``, else its parent call's);
        the returned trace is the call's ``trace`` from now on."""
        tool = call.tool
        self.metering.inflight(1, tool)
        if parent is None and call.parent is not None and call.parent.trace is not None:
            parent = call.parent.trace.as_parent()
        if isinstance(parent, Unsampled):
            return CallTrace(self, None, call.t0, parent.trace_id, parent.tracestate)
        if parent is None and self.sampling.fast:
            trace_id = new_trace_id()
            if not self.sampling.decide(trace_id, None):
                return CallTrace(self, None, call.t0, trace_id)
        attrs: dict[str, Any] = {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": tool,
            "gen_ai.tool.call.id": str(call.id),
            "gen_ai.tool.type": "extension",
            "toolhost.sidecar": call.sidecar,
        }
        if call.parent is not None:
            attrs["toolhost.parent.call.id"] = str(call.parent.id)
        span = self.tracer.start_span(
            f"execute_tool {tool}", context=parent, kind=SpanKind.INTERNAL, attributes=attrs
        )
        if self.capture_content and span.is_recording():
            span.set_attribute(
                "gen_ai.tool.call.arguments", self.redact(bytes(call.input_raw).decode())
            )
        return CallTrace(self, span, call.t0)

    def call_finished(self, call: TracedCall, env: Envelope) -> None:
        """Close the call's span with its outcome (the one finish step calls this)."""
        ct = call.trace
        if ct is None:
            return
        self.metering.inflight(-1, call.tool)
        span = ct.span
        if span is None:
            return
        ct.attempt_ended(None)  # still open only when the attempt was abandoned
        if not ct.recording:
            span.end()
            return
        meta = env.meta
        if meta.pid is not None:
            span.set_attribute("toolhost.worker.pid", meta.pid)
        span.set_attribute("toolhost.attempts", meta.attempts)
        if ct.queue_ms is not None:
            span.set_attribute("toolhost.queue_ms", ct.queue_ms)
        span.set_attribute("toolhost.status", env.status)
        if meta.truncated:
            span.set_attribute("toolhost.truncated", True)
        err = env.error
        if err is not None:
            span.set_attribute("error.type", err.code)
            span.set_status(Status(StatusCode.ERROR, err.message[:512]))
        if self.capture_content:
            span.set_attribute("gen_ai.tool.call.result", self.redact(env.content))
        span.end()

    def mcp_client_span(
        self, call: TracedCall, transport: str, session_id: str | None = None
    ) -> str:
        """Open the MCP CLIENT span of a call's ``tools/call`` attempt; returns its
        ``traceparent`` for ``params._meta`` (the span ends with the attempt)."""
        ct = call.trace
        assert ct is not None
        if ct.span is None:
            return unsampled_traceparent(ct.trace_id)
        ct.attempt_ended(None)
        attrs: dict[str, Any] = {
            "mcp.method.name": "tools/call",
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": call.tool,
            "network.transport": transport,
        }
        if session_id:
            attrs["mcp.session.id"] = session_id
        span = self.tracer.start_span(
            f"tools/call {call.tool}",
            context=trace.set_span_in_context(ct.span),  # sampled: under the call's span
            kind=SpanKind.CLIENT,
            attributes=attrs,
        )
        ct.client = span
        return traceparent_of(span)[0]

    # metrics hooks --------------------------------------------------------------------------

    def call_recorded(self, tool: str, env: Envelope) -> None:
        """Every ended call (refused ones too): the duration histogram by tool and status."""
        self.metering.call_ended(tool, env)

    # life ---------------------------------------------------------------------------------------

    def shutdown(self) -> None:
        """Flush and stop (blocking, bounded by the exporters' timeouts: run it on a thread)."""
        try:
            self.provider.force_flush(SHUTDOWN_TIMEOUT_MS)
            self.provider.shutdown()
        except Exception as exc:  # a collector that is down must not break the host's stop
            log.warning("telemetry: flush at shutdown failed: %s", exc)
        self.metering.shutdown()
