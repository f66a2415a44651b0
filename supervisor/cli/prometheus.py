"""``toolhost stats --prometheus``: ``system.stats`` in the Prometheus text exposition format
(version 0.0.4). Every metric is prefixed ``toolhost_``; labels are ``sidecar``, ``tool`` and,
where a figure has one, ``status``, ``reason``, ``rule`` or ``worker``.

Pure: a function of the stats document (as the client decodes it), so it can be served by any
exporter (a cron job writing a textfile-collector file, or a tiny HTTP wrapper).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

Labels = dict[str, str]
Sample = tuple[str, Labels, float]


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _number(value: float) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


class _Families:
    def __init__(self) -> None:
        self._order: list[str] = []
        self._meta: dict[str, tuple[str, str]] = {}
        self._samples: dict[str, list[Sample]] = {}

    def add(self, name: str, kind: str, help_text: str, samples: Iterable[Sample]) -> None:
        full = "toolhost_" + name
        if full not in self._meta:
            self._order.append(full)
            self._meta[full] = (kind, help_text)
            self._samples[full] = []
        for suffix, labels, value in samples:
            self._samples[full].append((full + suffix, labels, value))

    def render(self) -> str:
        lines: list[str] = []
        for name in self._order:
            kind, help_text = self._meta[name]
            lines.append(f"# HELP {name} {help_text}")
            lines.append(f"# TYPE {name} {kind}")
            for sample_name, labels, value in self._samples[name]:
                if labels:
                    body = ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())
                    lines.append(f"{sample_name}{{{body}}} {_number(value)}")
                else:
                    lines.append(f"{sample_name} {_number(value)}")
        return "\n".join(lines) + "\n"


def _counts(
    fam: _Families, scope: str, rows: list[tuple[Labels, dict[str, Any]]], what: str
) -> None:
    fam.add(
        f"{scope}_calls_total",
        "counter",
        f"Invocations of each {what} by outcome status.",
        (
            ("", {**labels, "status": status}, row.get(status, 0))
            for labels, row in rows
            for status in ("success", "failed", "unavailable")
        ),
    )
    for key, name, help_text in (
        ("timeouts", "timeouts_total", "Invocations that failed with code timeout."),
        ("cancels", "cancels_total", "Invocations that failed with code cancelled."),
        ("quotaLimited", "quota_limited_total", "Invocations refused quota-limited."),
        ("quotaExceeded", "quota_exceeded_total", "Invocations failed quota-exceeded."),
        ("bytesIn", "bytes_in_total", "Input bytes received for invocations."),
        ("bytesOut", "bytes_out_total", "Output bytes (data and content) returned."),
    ):
        fam.add(
            f"{scope}_{name}",
            "counter",
            help_text,
            (("", labels, row.get(key, 0)) for labels, row in rows),
        )
    samples: list[Sample] = []
    for labels, row in rows:
        lat = row.get("latency") or {}
        for q, key in (("0.5", "p50"), ("0.9", "p90"), ("0.99", "p99")):
            samples.append(("", {**labels, "quantile": q}, lat.get(key, 0.0) / 1000.0))
        samples.append(("_sum", labels, lat.get("sum", 0.0) / 1000.0))
        samples.append(("_count", labels, lat.get("count", 0)))
    fam.add(
        f"{scope}_latency_seconds",
        "summary",
        f"Latency of {what} invocations that reached a worker.",
        samples,
    )


def exposition(stats: dict[str, Any]) -> str:
    """Render a ``system.stats`` result as Prometheus text."""
    fam = _Families()
    fam.add(
        "uptime_seconds",
        "gauge",
        "Seconds since the host started.",
        [("", {}, stats.get("uptimeMs", 0.0) / 1000.0)],
    )
    host = stats.get("host") or {}
    for key, name, kind, help_text in (
        ("rssBytes", "host_rss_bytes", "gauge", "Resident memory of the host process."),
        ("cpuSeconds", "host_cpu_seconds_total", "counter", "CPU seconds of the host process."),
        ("spawns", "host_spawns_total", "counter", "Worker starts granted a spawn slot."),
        ("waitingToSpawn", "host_spawns_waiting", "gauge", "Worker starts waiting for a slot."),
        ("restarts", "host_restarts_total", "counter", "Worker restarts after failures."),
        (
            "restartsDelayed",
            "host_restarts_delayed_total",
            "counter",
            "Restarts that waited for the host-wide restart budget.",
        ),
    ):
        fam.add(name, kind, help_text, [("", {}, host.get(key, 0))])
    tools = stats.get("tools") or {}
    tool_rows = [
        ({"sidecar": row.get("sidecar") or "", "tool": name}, row)
        for name, row in sorted(tools.items())
    ]
    _counts(fam, "tool", tool_rows, "tool")
    fam.add(
        "tool_cpu_seconds_total",
        "counter",
        "CPU seconds of the tool's calls (reported by the sidecar, else sampled).",
        (("", labels, row.get("cpuSeconds", 0.0)) for labels, row in tool_rows),
    )
    fam.add(
        "tool_quota_limited",
        "gauge",
        "1 while a quota refuses calls of the tool.",
        (("", labels, bool(row.get("limited"))) for labels, row in tool_rows),
    )
    sidecars = stats.get("sidecars") or {}
    side_rows = [({"sidecar": sid}, row) for sid, row in sorted(sidecars.items())]
    for key, name, kind, help_text in (
        ("cpuSeconds", "sidecar_cpu_seconds_total", "counter", "CPU seconds of its workers."),
        ("rssBytes", "sidecar_rss_bytes", "gauge", "Resident memory of its workers now."),
        ("peakRssBytes", "sidecar_rss_peak_bytes", "gauge", "Highest sampled resident memory."),
        ("workers", "sidecar_workers", "gauge", "Workers now."),
        ("queued", "sidecar_queue_depth", "gauge", "Calls waiting for a free worker."),
        ("starts", "sidecar_starts_total", "counter", "Workers started."),
        ("restarts", "sidecar_restarts_total", "counter", "Restarts after failures."),
        ("retries", "sidecar_retries_total", "counter", "Calls retried (read-only tools)."),
        ("overloaded", "sidecar_overloaded_total", "counter", "Calls refused: queue full."),
    ):
        fam.add(name, kind, help_text, (("", lb, row.get(key, 0)) for lb, row in side_rows))
    fam.add(
        "sidecar_worker_exits_total",
        "counter",
        "Worker ends by reason.",
        (
            ("", {**lb, "reason": reason}, n)
            for lb, row in side_rows
            for reason, n in sorted((row.get("exits") or {}).items())
        ),
    )
    fam.add(
        "sidecar_limit_actions_total",
        "counter",
        "Workers or call processes stopped by the sampler, by rule.",
        (
            ("", {**lb, "rule": rule}, n)
            for lb, row in side_rows
            for rule, n in sorted((row.get("limitActions") or {}).items())
        ),
    )
    egress = [(lb, row["egress"]) for lb, row in side_rows if row.get("egress")]
    fam.add(
        "sidecar_egress_bytes_total",
        "counter",
        "Bytes through the host's egress proxy (in: from destinations, out: to them).",
        (
            ("", {**lb, "direction": way}, e.get(key, 0))
            for lb, e in egress
            for way, key in (("in", "bytesIn"), ("out", "bytesOut"))
        ),
    )
    fam.add(
        "sidecar_egress_connections_total",
        "counter",
        "Connections to the host's egress proxy, allowed or refused.",
        (
            ("", {**lb, "allowed": allowed}, e.get(key, 0))
            for lb, e in egress
            for allowed, key in (("true", "connections"), ("false", "refused"))
        ),
    )
    worker_rows = [
        ({"sidecar": sid, "worker": str(w.get("index", 0))}, w)
        for sid, row in sorted(sidecars.items())
        for w in row.get("workerStats") or []
    ]
    fam.add(
        "worker_rss_bytes",
        "gauge",
        "Resident memory of a worker and its children.",
        (("", lb, w.get("rssBytes", 0)) for lb, w in worker_rows),
    )
    fam.add(
        "worker_cpu_seconds_total",
        "counter",
        "CPU seconds of a worker and its children.",
        (("", lb, w.get("cpuSeconds", 0.0)) for lb, w in worker_rows),
    )
    fam.add(
        "worker_inflight",
        "gauge",
        "Calls running on a worker.",
        (("", lb, w.get("inflight", 0)) for lb, w in worker_rows),
    )
    return fam.render()
