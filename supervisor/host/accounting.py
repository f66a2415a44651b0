"""Accounting: call counters and latency per tool and per sidecar, resource usage per worker.

# Strategy: two writers, one reader. The invoke path calls :meth:`Accounting.record` once per
# envelope: a few integer increments and one histogram bucket per tool and per sidecar, no
# allocation beyond the first call of a tool. The sampler (``sampler.py``) writes measured CPU
# and RSS into :class:`WorkerUsage` and :class:`SidecarUsage` once per period. ``system.stats``
# reads both through :meth:`Accounting.snapshot` into the Structs of ``contracts/stats.py``.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any

import trio

from supervisor.contracts.envelope import Envelope
from supervisor.contracts.stats import (
    CallCounts,
    HostStats,
    Latency,
    SidecarStats,
    StatsResult,
    ToolStats,
    WorkerStats,
)
from supervisor.contracts.wire import NULL
from supervisor.policy.histogram import Histogram

if TYPE_CHECKING:
    from supervisor.calls.quotas import Quotas
    from supervisor.pools.guard import HostGuard
    from supervisor.pools.pool import Pool
    from supervisor.workers.base import Worker


class Counts:
    """Outcome counters and a latency histogram (mutable, for the call path)."""

    __slots__ = (
        "attempts",
        "bytes_in",
        "bytes_out",
        "calls",
        "cancels",
        "cpu_reported",
        "cpu_reported_calls",
        "cpu_sampled",
        "failed",
        "latency",
        "overloaded",
        "quota_exceeded",
        "quota_limited",
        "retries",
        "success",
        "timeouts",
        "unavailable",
    )

    def __init__(self) -> None:
        self.calls = self.success = self.failed = self.unavailable = 0
        self.timeouts = self.cancels = self.quota_limited = self.quota_exceeded = 0
        self.bytes_in = self.bytes_out = 0
        self.attempts = self.retries = self.overloaded = 0
        self.cpu_reported = self.cpu_sampled = 0.0
        self.cpu_reported_calls = 0
        self.latency = Histogram()

    def add(
        self, status: str, code: str | None, bytes_in: int, bytes_out: int, attempts: int
    ) -> None:
        self.calls += 1
        self.attempts += attempts
        if attempts > 1:
            self.retries += attempts - 1
        if status == "success":
            self.success += 1
        elif status == "failed":
            self.failed += 1
            if code == "timeout":
                self.timeouts += 1
            elif code == "cancelled":
                self.cancels += 1
            elif code == "quota-exceeded":
                self.quota_exceeded += 1
        else:
            self.unavailable += 1
            if code == "quota-limited":
                self.quota_limited += 1
            elif code == "overloaded":
                self.overloaded += 1
        self.bytes_in += bytes_in
        self.bytes_out += bytes_out

    def fill(self, out: CallCounts) -> None:
        out.calls, out.success, out.failed = self.calls, self.success, self.failed
        out.unavailable, out.timeouts, out.cancels = self.unavailable, self.timeouts, self.cancels
        out.quotaLimited, out.quotaExceeded = self.quota_limited, self.quota_exceeded
        out.bytesIn, out.bytesOut = self.bytes_in, self.bytes_out
        out.latency = latency_of(self.latency)


def latency_of(h: Histogram) -> Latency:
    return Latency(
        count=h.count,
        p50=round(h.quantile(0.50), 3),
        p90=round(h.quantile(0.90), 3),
        p99=round(h.quantile(0.99), 3),
        max=round(h.max, 3),
        sum=round(h.total, 3),
    )


class WorkerUsage:
    """What the sampler measured of one worker."""

    __slots__ = ("acted", "cpu", "last", "peak_rss", "processes", "rss")

    def __init__(self) -> None:
        self.cpu = 0.0
        self.rss = 0
        self.peak_rss = 0
        self.processes = 0
        self.last: dict[int, float] = {}
        """CPU seconds of each measured process tree at the previous sample, by root pid."""
        self.acted = False
        """The sampler already asked this worker to go (no second action)."""


class SidecarUsage:
    """What the sampler measured of one sidecar, across all its workers ever."""

    __slots__ = ("cpu", "limit_actions", "peak_rss", "rss")

    def __init__(self) -> None:
        self.cpu = 0.0
        self.rss = 0
        self.peak_rss = 0
        self.limit_actions: Counter[str] = Counter()


class Accounting:
    """Counters and measurements of one host."""

    def __init__(self, interval_ms: int = 1000) -> None:
        self.interval_ms = interval_ms
        self.tools: dict[str, Counts] = {}
        self.tool_sidecar: dict[str, str | None] = {}
        self.sidecars: dict[str, Counts] = {}
        self.workers: dict[Worker, WorkerUsage] = {}
        self.usage: dict[str, SidecarUsage] = {}
        self.requests: Counter[str] = Counter()
        """Host-service requests by sidecar (PROTOCOL 3.5)."""
        self.samples = 0
        self.host_rss = 0
        self.host_cpu = 0.0

    # the call path -----------------------------------------------------------------------

    def record(self, tool: str, sidecar: str | None, env: Envelope, bytes_in: int) -> None:
        """Count one envelope of a known tool (cheap: called once per invocation)."""
        counts = self.tools.get(tool)
        if counts is None:
            counts = self.tools[tool] = Counts()
        self.tool_sidecar[tool] = sidecar
        content = env.content
        out = len(content) if content.isascii() else len(content.encode("utf-8"))
        if env.data is not NULL:
            out += len(env.data)
        error = env.error
        code = error.code if error is not None else None
        meta = env.meta
        counts.add(env.status, code, bytes_in, out, meta.attempts)
        side = None
        if sidecar is not None:
            side = self.sidecars.get(sidecar)
            if side is None:
                side = self.sidecars[sidecar] = Counts()
            side.add(env.status, code, bytes_in, out, meta.attempts)
        if meta.attempts:
            ms = meta.durationMs
            counts.latency.record(ms)
            if side is not None:
                side.latency.record(ms)
        if meta.cpuMs is not None:
            counts.cpu_reported += meta.cpuMs / 1000.0
            counts.cpu_reported_calls += 1

    def count_request(self, sidecar: str) -> None:
        """Count one host-service request of a sidecar's worker."""
        self.requests[sidecar] += 1

    # the sampler's side ------------------------------------------------------------------

    def worker_usage(self, worker: Worker) -> WorkerUsage:
        usage = self.workers.get(worker)
        if usage is None:
            usage = self.workers[worker] = WorkerUsage()
        return usage

    def sidecar_usage(self, sidecar: str) -> SidecarUsage:
        usage = self.usage.get(sidecar)
        if usage is None:
            usage = self.usage[sidecar] = SidecarUsage()
        return usage

    def attribute(self, tool: str, cpu: float) -> None:
        """Add sampled CPU seconds to a tool's running calls."""
        counts = self.tools.get(tool)
        if counts is None:
            counts = self.tools[tool] = Counts()
        counts.cpu_sampled += cpu

    def forget_workers(self, live: set[Any]) -> None:
        """Drop the usage of workers that are gone."""
        for worker in [w for w in self.workers if w not in live]:
            del self.workers[worker]

    # reading -----------------------------------------------------------------------------

    def snapshot(
        self,
        pools: dict[str, Pool],
        guard: HostGuard | None,
        quotas: Quotas | None,
        *,
        uptime_ms: float,
    ) -> StatsResult:
        """Everything ``system.stats`` reports."""
        now = trio.current_time()
        sidecars: dict[str, SidecarStats] = {}
        names = sorted(set(pools) | set(self.sidecars))
        for sid in names:
            st = SidecarStats()
            counts = self.sidecars.get(sid)
            if counts is not None:
                counts.fill(st)
                st.attempts, st.retries = counts.attempts, counts.retries
                st.overloaded = counts.overloaded
            st.hostRequests = self.requests.get(sid, 0)
            usage = self.usage.get(sid)
            if usage is not None:
                st.cpuSeconds = round(usage.cpu, 3)
                st.rssBytes, st.peakRssBytes = usage.rss, usage.peak_rss
                st.limitActions = dict(usage.limit_actions)
            pool = pools.get(sid)
            if pool is not None:
                ps = pool.statistics()
                st.starts, st.restarts, st.exits = ps.starts, ps.restarts, ps.exits
                st.workers, st.queued = len(pool.workers), ps.queued
                st.workerStats = [self._worker(w, now) for w in pool.workers]
            if quotas is not None:
                st.quota = quotas.usage(f"sidecar:{sid}")
                st.limitedTools = quotas.limited_tools(sid)
            sidecars[sid] = st
        tools: dict[str, ToolStats] = {}
        for tool in sorted(self.tools):
            counts = self.tools[tool]
            ts = ToolStats(sidecar=self.tool_sidecar.get(tool))
            counts.fill(ts)
            ts.cpuReportedSeconds = round(counts.cpu_reported, 3)
            ts.cpuReportedCalls = counts.cpu_reported_calls
            ts.cpuSampledSeconds = round(counts.cpu_sampled, 3)
            ts.cpuSeconds = (
                ts.cpuReportedSeconds if counts.cpu_reported_calls else ts.cpuSampledSeconds
            )
            if quotas is not None:
                ts.quota = quotas.usage(f"tool:{tool}")
                ts.limited = quotas.is_limited(tool)
            tools[tool] = ts
        host = HostStats(rssBytes=self.host_rss, cpuSeconds=round(self.host_cpu, 3))
        if guard is not None:
            g = guard.stats()
            host.maxConcurrentSpawns, host.spawning = g.maxConcurrentSpawns, g.spawning
            host.waitingToSpawn, host.spawns = g.waitingToSpawn, g.spawns
            host.maxRestartsPerSecond, host.restarts = g.maxRestartsPerSecond, g.restarts
            host.restartsDelayed = g.restartsDelayed
        return StatsResult(
            uptimeMs=round(uptime_ms, 1),
            sampleIntervalMs=self.interval_ms,
            samples=self.samples,
            host=host,
            sidecars=sidecars,
            tools=tools,
        )

    def _worker(self, w: Worker, now: float) -> WorkerStats:
        usage = self.workers.get(w)
        return WorkerStats(
            index=w.index,
            pid=w.pid,
            state=w.state,
            inflight=w.inflight,
            calls=w.calls_issued,
            uptimeMs=round((now - w.started_at) * 1000.0, 1) if w.started_at else 0.0,
            cpuSeconds=round(usage.cpu, 3) if usage else 0.0,
            rssBytes=usage.rss if usage else 0,
            peakRssBytes=usage.peak_rss if usage else 0,
            processes=usage.processes if usage else 0,
        )
