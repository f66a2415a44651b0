"""Scenario 3: throughput with 1, 8 and 64 calls in flight on pools of 1 and 2 workers.

Each row is one NDJSON connection keeping a window of calls in flight (an answer is replaced by
a new call at once). Its baseline is the pipelined single-hop floor: one thread writing call
lines straight into an echo worker while another reads the results back. The echo workers
advertise enough concurrency that the window, not the worker, limits what is in flight, and
the floor's worker is configured the same way.
"""

from __future__ import annotations

from bench.clients import PipelinedClient
from bench.floors import pipelined
from bench.machine import CpuWindow
from bench.run import PAYLOAD, THROUGHPUT_CONCURRENCY, Bench, tool_of
from bench.stats import Figure, Row, Stats, Target

PIPELINED = "pipelined floor (1 worker)"
WINDOWS = (1, 8, 64)
POOLS = (("tp1", 1), ("tp2", 2))
CPU_TARGET_US = 30.0


def row_name(workers: int, window: int) -> str:
    return f"toolhost {workers} worker{'s' if workers > 1 else ''}, {window} in flight"


def throughput(b: Bench) -> None:
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
