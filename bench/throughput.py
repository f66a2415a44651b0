"""Scenario 3: throughput with 1, 8 and 64 calls in flight on pools of 1 and 2 workers.

Each row is one NDJSON connection keeping a window of calls in flight (an answer is replaced by
a new call at once). Two configurations:

- **concurrency-1 workers** (the SDK default, what users run): toolhost against the plain
  NDJSON relay (:mod:`bench.ndjson_relay`, the simplest possible host: decode the request, queue
  it, write a ``call`` line, decode the ``result``, answer) with the same workers, same window,
  measured in the same run; host CPU per call and calls/s are reported as ratios to the relay's.
- **concurrency-64 workers**, where the window and not the worker limits what is in flight:
  toolhost against the pipelined single-hop floor (one thread writing call lines straight into
  an echo worker while another reads the results back).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time

from bench.clients import PipelinedClient, unix_connect
from bench.floors import pipelined
from bench.machine import CpuWindow
from bench.run import PAYLOAD, THROUGHPUT_CONCURRENCY, Bench, tool_of
from bench.stats import Figure, Row, Stats, Target

PIPELINED = "pipelined floor (1 worker)"
WINDOWS = (1, 8, 64)
POOLS = (("tp1", 1), ("tp2", 2))
C1_POOLS = (("c1w1", 1), ("c1w2", 2))
CPU_TARGET_US = 30.0
CPU_RATIO_TARGET = 1.5
RATE_RATIO_TARGET = 0.9


def row_name(workers: int, window: int) -> str:
    return f"toolhost {workers} worker{'s' if workers > 1 else ''}, {window} in flight"


def throughput(b: Bench) -> None:
    throughput_c1(b)
    s = b.settings
    calls = s.throughput_calls
    floor = pipelined(calls, PAYLOAD, concurrency=THROUGHPUT_CONCURRENCY)
    b.results.add(
        Row(
            scenario="throughput",
            name=PIPELINED,
            rate=floor["rate"],
            extra={"calls": calls, "elapsedS": floor["elapsedS"], "failed": floor["failed"]},
        )
    )
    host = b.host
    for sidecar, workers in POOLS:
        tool = tool_of(sidecar)
        host.wait_workers(sidecar, workers)
        for window in WINDOWS:
            sock = host.connect()
            try:
                client = PipelinedClient(sock, tool, PAYLOAD, window)
                client.run(max(window * 4, calls // 10))  # warm-up
                cpu = CpuWindow(host.pid).start()
                lat, elapsed, bad = client.run(calls)
                cpu.stop()
            finally:
                sock.close()
            row = Row(
                scenario="throughput",
                name=row_name(workers, window),
                stats=Stats.of(lat),
                rate=calls / elapsed,
                baseline=PIPELINED,
                extra={
                    "workers": workers,
                    "inFlight": window,
                    **cpu.per_call_us(calls),
                    "hostCpuShare": cpu.seconds / elapsed,
                    "failed": bad,
                },
                samples=lat,
            )
            b.results.add(row)
            if workers == 2 and window == 64:
                row.target = Target("calls/s >= 1/3 floor (ratio <= 3)", 3.0)
                b.results.figure(
                    Figure(
                        "throughput",
                        "host CPU per call, 2 workers, 64 in flight",
                        row.extra["hostCpuUsPerCall"],
                        "us",
                        target=Target(f"<= {CPU_TARGET_US:g} us", CPU_TARGET_US),
                        note="utime+stime of the toolhost serve process over the window / calls",
                    )
                )


def relay_name(workers: int, window: int) -> str:
    return f"ndjson relay {workers} worker{'s' if workers > 1 else ''} c1, {window} in flight"


def c1_name(workers: int, window: int) -> str:
    return f"toolhost {workers} worker{'s' if workers > 1 else ''} c1, {window} in flight"


def _measure(
    sock: socket.socket, tool: str, window: int, calls: int, pid: int
) -> tuple[list[float], float, int, CpuWindow]:
    """Warm up, then ``calls`` calls with ``window`` in flight; the CPU of process ``pid``."""
    client = PipelinedClient(sock, tool, PAYLOAD, window)
    client.run(max(window * 4, calls // 10))  # warm-up
    cpu = CpuWindow(pid).start()
    lat, elapsed, bad = client.run(calls)
    cpu.stop()
    return lat, elapsed, bad, cpu


def relay_rows(b: Bench, workers: int, calls: int) -> dict[int, Row]:
    """The plain relay with ``workers`` concurrency-1 echo workers, at every window."""
    rows: dict[int, Row] = {}
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "relay.sock")
        for window in WINDOWS:
            proc = subprocess.Popen(
                [sys.executable, "-m", "bench.ndjson_relay", path, str(workers), "1"],
                stdout=subprocess.PIPE,
            )
            try:
                assert proc.stdout is not None
                if proc.stdout.readline().strip() != b"listening":
                    raise RuntimeError("the ndjson relay did not start")
                sock = unix_connect(path)
                try:
                    lat, elapsed, bad, cpu = _measure(sock, "bench.echo", window, calls, proc.pid)
                finally:
                    sock.close()
            finally:
                proc.kill()
                proc.wait()
                if os.path.exists(path):
                    os.unlink(path)
            row = Row(
                scenario="throughput",
                name=relay_name(workers, window),
                stats=Stats.of(lat),
                rate=calls / elapsed,
                extra={
                    "workers": workers,
                    "inFlight": window,
                    **cpu.per_call_us(calls),
                    "failed": bad,
                },
                samples=lat,
            )
            b.results.add(row)
            rows[window] = row
            time.sleep(0.05)
    return rows


def throughput_c1(b: Bench) -> None:
    """Concurrency-1 workers, toolhost vs the plain relay, same run."""
    calls = b.settings.throughput_calls
    if b.settings.quick:
        calls = min(calls, 400)  # 12 rows: keep the smoke run short
    host = b.host
    for sidecar, workers in C1_POOLS:
        base = relay_rows(b, workers, calls)
        tool = tool_of(sidecar)
        host.wait_workers(sidecar, workers)
        for window in WINDOWS:
            sock = host.connect()
            try:
                lat, elapsed, bad, cpu = _measure(sock, tool, window, calls, host.pid)
            finally:
                sock.close()
            relay = base[window]
            cpu_us = cpu.per_call_us(calls)
            relay_cpu = relay.extra["hostCpuUsPerCall"]
            # CPU times tick at 10 ms: a quick run's relay can read 0, which says nothing.
            ratio_cpu = cpu_us["hostCpuUsPerCall"] / relay_cpu if relay_cpu else None
            rate = calls / elapsed
            row = Row(
                scenario="throughput",
                name=c1_name(workers, window),
                stats=Stats.of(lat),
                rate=rate,
                baseline=relay.name,
                extra={
                    "workers": workers,
                    "inFlight": window,
                    **cpu_us,
                    "cpuRatioToRelay": ratio_cpu,
                    "rateRatioToRelay": rate / relay.rate if relay.rate else None,
                    "failed": bad,
                },
                samples=lat,
            )
            b.results.add(row)
            if ratio_cpu is not None:
                b.results.figure(
                    Figure(
                        "throughput",
                        f"host CPU per call / relay's, c1, {workers}w, {window} in flight",
                        ratio_cpu,
                        "x",
                        target=Target(f"<= {CPU_RATIO_TARGET:g}x", CPU_RATIO_TARGET),
                        note="utime+stime of toolhost serve vs of the ndjson relay, same calls",
                    )
                )
            b.results.figure(
                Figure(
                    "throughput",
                    f"calls/s / relay's, c1, {workers}w, {window} in flight",
                    rate / relay.rate if relay.rate else 0.0,
                    "x",
                    note=f"target >= {RATE_RATIO_TARGET:g}x (higher is better)",
                )
            )
