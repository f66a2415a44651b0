"""``system.stats``: accounting per sidecar, per tool and per worker (PROTOCOL 6 and
docs/quotas-and-limits.md). Durations are milliseconds, CPU is seconds, memory is bytes."""

from __future__ import annotations

import msgspec
from msgspec import Struct

from supervisor.contracts.confine import EgressStats


class Latency(Struct, kw_only=True):
    """Latency of calls that reached a worker (refusals are not timed), from a log-scale
    histogram: quantiles are bucket upper bounds (at most 19 % high), ``max`` is exact."""

    count: int = 0
    p50: float = 0.0
    p90: float = 0.0
    p99: float = 0.0
    max: float = 0.0
    sum: float = 0.0


class CallCounts(Struct, kw_only=True):
    """Outcomes of invocations; each invocation counts once (retries are ``attempts``)."""

    calls: int = 0
    success: int = 0
    failed: int = 0
    unavailable: int = 0
    timeouts: int = 0
    cancels: int = 0
    quotaLimited: int = 0
    """Refused ``quota-limited`` (counted in ``unavailable`` too)."""
    quotaExceeded: int = 0
    """Failed ``quota-exceeded`` (counted in ``failed`` too)."""
    bytesIn: int = 0
    bytesOut: int = 0
    latency: Latency = msgspec.field(default_factory=Latency)


class ToolStats(CallCounts, kw_only=True):
    sidecar: str | None = None
    cpuSeconds: float = 0.0
    """``cpuReportedSeconds`` when any call reported its CPU, else ``cpuSampledSeconds``."""
    cpuReportedSeconds: float = 0.0
    """Sum of per-call CPU the sidecar reported (SDK ``cpuMs``)."""
    cpuReportedCalls: int = 0
    cpuSampledSeconds: float = 0.0
    """CPU the sampler attributed to this tool's running calls (split evenly per worker)."""
    quota: dict[str, int] = msgspec.field(default_factory=dict)
    """Window usage of the tool's own quota (``callsLastMinute``, ``callsToday``, ``running``)."""
    limited: bool = False
    """The tool is ``sandbox: quota-limited`` now."""


class WorkerStats(Struct, kw_only=True):
    index: int
    pid: int | None
    state: str
    inflight: int = 0
    calls: int = 0
    uptimeMs: float = 0.0
    cpuSeconds: float = 0.0
    rssBytes: int = 0
    peakRssBytes: int = 0
    processes: int = 0
    """Processes measured for this worker: itself and its descendants (per-call protocols:
    the call processes running now)."""


class SidecarStats(CallCounts, kw_only=True):
    attempts: int = 0
    """Attempts handed to a worker (retries included)."""
    retries: int = 0
    overloaded: int = 0
    hostRequests: int = 0
    """Host-service requests (PROTOCOL 3.5) its workers made."""
    starts: int = 0
    cpuSeconds: float = 0.0
    """CPU of every worker process (and its children) since the host started, sampled."""
    rssBytes: int = 0
    peakRssBytes: int = 0
    restarts: int = 0
    exits: dict[str, int] = msgspec.field(default_factory=dict)
    """Why workers ended, by reason (crashed, hung, protocol-error, quota-exceeded, recycled...)."""
    limitActions: dict[str, int] = msgspec.field(default_factory=dict)
    """Workers or call processes killed or recycled by the sampler, by rule
    (``rssMb``, ``cpuSecondsPerCall``, ``nproc``)."""
    workers: int = 0
    queued: int = 0
    workerStats: list[WorkerStats] = msgspec.field(default_factory=list)
    quota: dict[str, int] = msgspec.field(default_factory=dict)
    limitedTools: list[str] = msgspec.field(default_factory=list)
    egress: EgressStats | None = None
    """Its connections through the host's egress proxy since the host started (PROTOCOL 7:
    ``connections`` allowed, ``refused``, ``bytesIn`` from the destinations, ``bytesOut`` to
    them, ``open`` now); None: it made none."""


class HostStats(Struct, kw_only=True):
    rssBytes: int = 0
    cpuSeconds: float = 0.0
    maxConcurrentSpawns: int = 0
    spawning: int = 0
    waitingToSpawn: int = 0
    spawns: int = 0
    maxRestartsPerSecond: float = 0.0
    restarts: int = 0
    restartsDelayed: int = 0


class StatsResult(Struct, kw_only=True):
    uptimeMs: float
    sampleIntervalMs: int
    samples: int
    """Sampler ticks so far (RSS and CPU figures are as of the latest)."""
    host: HostStats
    sidecars: dict[str, SidecarStats]
    tools: dict[str, ToolStats]
