"""A loopback OTLP/HTTP collector for the telemetry tests (a stand-in for the operator's one).

It accepts ``POST /v1/traces`` and ``POST /v1/metrics`` with protobuf bodies, decodes them with
``opentelemetry-proto`` (the reference messages, not the host's code), and keeps the spans and
metric names it saw. ``hang()`` makes every request wait until ``release()``: a collector that
accepts connections and never answers.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue


def _value(v: AnyValue) -> Any:
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind is not None else None


@dataclass
class Span:
    """One received span, flattened for assertions."""

    service: str
    name: str
    kind: int
    trace_id: str
    span_id: str
    parent_id: str
    attributes: dict[str, Any]
    events: list[str]
    status_code: int
    status_message: str

    # proto enums: SPAN_KIND_INTERNAL=1, SERVER=2, CLIENT=3; STATUS_CODE_ERROR=2
    @property
    def is_error(self) -> bool:
        return self.status_code == 2


@dataclass
class Receiver:
    """What the collector got, guarded by one condition."""

    spans: list[Span] = field(default_factory=list)
    bodies: list[bytes] = field(default_factory=list)
    """Every ``/v1/traces`` request body as received (to look for a value anywhere in it)."""
    metrics: set[str] = field(default_factory=set)
    requests: int = 0
    cond: threading.Condition = field(default_factory=threading.Condition)
    hanging: threading.Event = field(default_factory=threading.Event)
    released: threading.Event = field(default_factory=threading.Event)
    port: int = 0

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def hang(self) -> None:
        self.released.clear()
        self.hanging.set()

    def release(self) -> None:
        self.hanging.clear()
        self.released.set()

    def wait(self, pred: Callable[[Receiver], Any], timeout: float = 30, what: str = "") -> Any:
        """Wait until ``pred(self)`` is truthy (on arrivals, not polling); return its value."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                value = pred(self)
                if value:
                    return value
                left = deadline - time.monotonic()
                if left <= 0:
                    names = sorted({s.name for s in self.spans})
                    raise AssertionError(
                        f"timed out waiting for {what}; spans seen: {names}; "
                        f"metrics seen: {sorted(self.metrics)}"
                    )
                self.cond.wait(left)

    def named(self, name: str) -> list[Span]:
        return [s for s in self.spans if s.name == name]

    def _add_traces(self, body: bytes) -> None:
        req = ExportTraceServiceRequest()
        req.ParseFromString(body)
        out = []
        for rs in req.resource_spans:
            attrs = {a.key: _value(a.value) for a in rs.resource.attributes}
            service = str(attrs.get("service.name", ""))
            for ss in rs.scope_spans:
                for s in ss.spans:
                    out.append(
                        Span(
                            service=service,
                            name=s.name,
                            kind=s.kind,
                            trace_id=s.trace_id.hex(),
                            span_id=s.span_id.hex(),
                            parent_id=s.parent_span_id.hex(),
                            attributes={a.key: _value(a.value) for a in s.attributes},
                            events=[e.name for e in s.events],
                            status_code=s.status.code,
                            status_message=s.status.message,
                        )
                    )
        with self.cond:
            self.spans.extend(out)
            self.bodies.append(body)
            self.cond.notify_all()

    def _add_metrics(self, body: bytes) -> None:
        req = ExportMetricsServiceRequest()
        req.ParseFromString(body)
        names = {
            m.name for rm in req.resource_metrics for sm in rm.scope_metrics for m in sm.metrics
        }
        with self.cond:
            self.metrics |= names
            self.cond.notify_all()


def start_receiver() -> tuple[Receiver, ThreadingHTTPServer]:
    """Serve a :class:`Receiver` on a free loopback port (call ``server.shutdown()`` after)."""
    rec = Receiver()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length)
            with rec.cond:
                rec.requests += 1
                rec.cond.notify_all()
            if rec.hanging.is_set():
                rec.released.wait(120)
            if self.path.endswith("/v1/traces"):
                rec._add_traces(body)
            elif self.path.endswith("/v1/metrics"):
                rec._add_metrics(body)
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    rec.port = server.server_address[1]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return rec, server
