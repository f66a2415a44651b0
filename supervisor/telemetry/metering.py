"""The host's OpenTelemetry metrics, next to the Prometheus text (docs/telemetry.md).

# Strategy: one ``MeterProvider`` per host with a periodic reader and the OTLP/HTTP exporter
# (interval from ``OTEL_METRIC_EXPORT_INTERVAL``), exporting on the reader's own thread. What
# changes per call (the duration histogram, calls in flight) is aggregated here in plain dicts,
# a few hundred nanoseconds per call, and read at export time: in flight through an observable
# counter, the histogram added to each export by a thin wrapper around the OTLP exporter (an
# SDK instrument costs ~10 µs per record, a third of a call's host CPU). Rare events (worker
# starts and exits, probes) use SDK instruments; queue depth is an observable gauge.
"""

from __future__ import annotations

import bisect
import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    Histogram,
    HistogramDataPoint,
    Metric,
    MetricExporter,
    MetricExportResult,
    MetricsData,
    PeriodicExportingMetricReader,
    ResourceMetrics,
    ScopeMetrics,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

import supervisor
from supervisor.contracts.envelope import Envelope

log = logging.getLogger("toolhost.telemetry")

DURATION_BUCKETS_S = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0
)  # fmt: skip


class CallDurations:
    """The call duration histogram, aggregated on the call path with a dict lookup and a
    bisect (the SDK's instruments cost ~10 µs per record); exported as a cumulative OTLP
    histogram by :class:`_WithCallDurations`."""

    def __init__(self, bounds: tuple[float, ...] = DURATION_BUCKETS_S) -> None:
        self.bounds = bounds
        self.start_ns = time.time_ns()
        self._lock = threading.Lock()
        self._series: dict[tuple[Any, ...], list[Any]] = {}
        """attributes -> [count, sum, min, max, bucket counts]"""

    def record(self, key: tuple[Any, ...], seconds: float) -> None:
        i = bisect.bisect_left(self.bounds, seconds)
        with self._lock:
            s = self._series.get(key)
            if s is None:
                s = self._series[key] = [0, 0.0, seconds, seconds, [0] * (len(self.bounds) + 1)]
            s[0] += 1
            s[1] += seconds
            if seconds < s[2]:
                s[2] = seconds
            if seconds > s[3]:
                s[3] = seconds
            s[4][i] += 1

    def metric(self) -> Metric | None:
        """The histogram as an SDK metric point (None before the first call)."""
        now = time.time_ns()
        with self._lock:
            snapshot = [(k, s[0], s[1], s[2], s[3], list(s[4])) for k, s in self._series.items()]
        if not snapshot:
            return None
        points = [
            HistogramDataPoint(
                attributes=dict(zip(DURATION_KEYS, key, strict=True)),
                start_time_unix_nano=self.start_ns,
                time_unix_nano=now,
                count=count,
                sum=total,
                bucket_counts=buckets,
                explicit_bounds=list(self.bounds),
                min=low,
                max=high,
            )
            for key, count, total, low, high, buckets in snapshot
        ]
        return Metric(
            name="toolhost.call.duration",
            description="Tool call duration, from acceptance to the envelope",
            unit="s",
            data=Histogram(
                data_points=points,
                aggregation_temporality=AggregationTemporality.CUMULATIVE,
            ),
        )


DURATION_KEYS = ("gen_ai.tool.name", "toolhost.status", "error.type", "toolhost.sidecar")


class _WithCallDurations(MetricExporter):
    """The OTLP exporter, with the call duration histogram added to every export."""

    def __init__(self, inner: MetricExporter, durations: CallDurations) -> None:
        super().__init__(
            preferred_temporality=inner._preferred_temporality,
            preferred_aggregation=inner._preferred_aggregation,
        )
        self.inner = inner
        self.durations = durations

    def export(
        self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any
    ) -> MetricExportResult:
        metric = self.durations.metric()
        if metric is not None:
            scope = ScopeMetrics(
                scope=InstrumentationScope("toolhost.calls", supervisor.__version__),
                metrics=[metric],
                schema_url="",
            )
            resource_metrics = list(metrics_data.resource_metrics)
            if resource_metrics:
                first = resource_metrics[0]
                resource_metrics[0] = ResourceMetrics(
                    resource=first.resource,
                    scope_metrics=[*first.scope_metrics, scope],
                    schema_url=first.schema_url,
                )
                metrics_data = MetricsData(resource_metrics=resource_metrics)
        return self.inner.export(metrics_data, timeout_millis=timeout_millis, **kwargs)

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return self.inner.force_flush(timeout_millis)

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        self.inner.shutdown(timeout_millis=timeout_millis, **kwargs)


QueueDepth = Callable[[], Iterable[tuple[str, int]]]


class Metering:
    """The instruments of one host.

    Args:
        provider: The host's own meter provider.
        durations: The call duration histogram its exporter adds.
        queue_depth: ``(sidecar, calls queued)`` of every pool, read at each export.
    """

    def __init__(
        self,
        provider: MeterProvider,
        durations: CallDurations | None = None,
        queue_depth: QueueDepth = lambda: (),
    ) -> None:
        self.provider = provider
        self.durations = durations or CallDurations()
        meter = provider.get_meter("toolhost", supervisor.__version__)
        self._inflight: dict[str, int] = {}
        meter.create_observable_up_down_counter(
            "toolhost.calls.in_flight",
            callbacks=[self._observe_inflight],
            unit="{call}",
            description="Calls accepted and not ended",
        )
        self.worker_starts = meter.create_counter(
            "toolhost.worker.starts", unit="{worker}", description="Workers that became ready"
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
        self.queue_depth = queue_depth
        meter.create_observable_gauge(
            "toolhost.pool.queue_depth",
            callbacks=[self._observe_queues],
            unit="{call}",
            description="Calls waiting in a sidecar's pool queue",
        )

    @classmethod
    def from_env(cls, resource: Resource, queue_depth: QueueDepth = lambda: ()) -> Metering:
        """Periodic OTLP/HTTP export configured by the ``OTEL_*`` variables."""
        durations = CallDurations()
        reader = PeriodicExportingMetricReader(_WithCallDurations(OTLPMetricExporter(), durations))
        provider = MeterProvider(resource=resource, metric_readers=[reader], shutdown_on_exit=False)
        return cls(provider, durations, queue_depth)

    def _observe_queues(self, _options: CallbackOptions) -> Iterable[Observation]:
        return [Observation(n, {"toolhost.sidecar": sid}) for sid, n in self.queue_depth()]

    def _observe_inflight(self, _options: CallbackOptions) -> Iterable[Observation]:
        return [Observation(n, {"gen_ai.tool.name": t}) for t, n in list(self._inflight.items())]

    def inflight(self, delta: int, tool: str) -> None:
        inflight = self._inflight
        inflight[tool] = inflight.get(tool, 0) + delta

    def call_ended(self, tool: str, env: Envelope) -> None:
        err = env.error
        key = (tool, env.status, err.code if err is not None else None, env.meta.sidecar)
        self.durations.record(key, env.meta.durationMs / 1000.0)

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
