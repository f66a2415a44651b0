"""The host's OpenTelemetry metrics, next to the Prometheus text (docs/telemetry.md).

# Strategy: one ``MeterProvider`` per host with a periodic reader and the OTLP/HTTP exporter
# (interval from ``OTEL_METRIC_EXPORT_INTERVAL``), exporting on the reader's own thread. The call
# path only adds to instruments the SDK aggregates in memory; queue depth is an observable gauge
# read by the reader, so nothing is measured when nobody exports.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource

import supervisor
from supervisor.contracts.envelope import Envelope

log = logging.getLogger("toolhost.telemetry")

DURATION_BUCKETS_S = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0
)  # fmt: skip


class Metering:
    """The instruments of one host.

    Args:
        provider: The host's own meter provider.
    """

    def __init__(self, provider: MeterProvider) -> None:
        self.provider = provider
        meter = provider.get_meter("toolhost", supervisor.__version__)
        self.duration = meter.create_histogram(
            "toolhost.call.duration",
            unit="s",
            description="Tool call duration, from acceptance to the envelope",
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS_S,
        )
        self._inflight = meter.create_up_down_counter(
            "toolhost.calls.in_flight", unit="{call}", description="Calls accepted and not ended"
        )
        self.worker_starts = meter.create_counter(
            "toolhost.worker.starts", unit="{worker}", description="Worker processes started"
        )
        self.worker_exits = meter.create_counter(
            "toolhost.worker.exits", unit="{worker}", description="Worker exits by reason"
        )
        self.probe = meter.create_histogram(
            "toolhost.probe.duration",
            unit="s",
            description="Health probe round trip (ping to pong)",
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS_S,
        )
        self.queue_depth: Callable[[], Iterable[tuple[str, int]]] = lambda: ()
        """``(sidecar, calls queued)`` of every pool (the host sets it)."""
        meter.create_observable_gauge(
            "toolhost.pool.queue_depth",
            callbacks=[self._observe_queues],
            unit="{call}",
            description="Calls waiting in a sidecar's pool queue",
        )

    @classmethod
    def from_env(cls, resource: Resource) -> Metering:
        """Periodic OTLP/HTTP export configured by the ``OTEL_*`` variables."""
        reader = PeriodicExportingMetricReader(OTLPMetricExporter())
        return cls(
            MeterProvider(resource=resource, metric_readers=[reader], shutdown_on_exit=False)
        )

    def _observe_queues(self, _options: CallbackOptions) -> Iterable[Observation]:
        return [Observation(n, {"toolhost.sidecar": sid}) for sid, n in self.queue_depth()]

    def inflight(self, delta: int, tool: str) -> None:
        self._inflight.add(delta, {"gen_ai.tool.name": tool})

    def call_ended(self, tool: str, env: Envelope) -> None:
        attrs: dict[str, Any] = {"gen_ai.tool.name": tool, "toolhost.status": env.status}
        if env.error is not None:
            attrs["error.type"] = env.error.code
        if env.meta.sidecar:
            attrs["toolhost.sidecar"] = env.meta.sidecar
        self.duration.record(env.meta.durationMs / 1000.0, attrs)

    def worker_started(self, sidecar: str, started_by: str) -> None:
        self.worker_starts.add(1, {"toolhost.sidecar": sidecar, "toolhost.started_by": started_by})

    def worker_exited(self, sidecar: str, reason: str) -> None:
        self.worker_exits.add(1, {"toolhost.sidecar": sidecar, "toolhost.exit.reason": reason})

    def probed(self, sidecar: str, seconds: float, answered: bool) -> None:
        self.probe.record(
            seconds, {"toolhost.sidecar": sidecar, "toolhost.probe.answered": answered}
        )

    def shutdown(self) -> None:
        try:
            self.provider.shutdown(timeout_millis=3000)
        except Exception as exc:
            log.warning("telemetry: metrics shutdown failed: %s", exc)
