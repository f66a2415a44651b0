"""One call in flight: the floors (scenario 1), toolhost end to end on NDJSON, MessagePack and
WebSocket (scenario 2), and payload scaling against the raw pipe (scenario 5).

Host CPU per call is read from the host's own accounting over each timed window, after the
warm-up, and divided by the calls in the window.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import msgspec

from bench.clients import (
    LineClient,
    MsgpackClient,
    WsClient,
    check_envelope,
    invoke_request,
    msgpack_frame,
    ndjson,
)
from bench.floors import call_line, direct_worker, raw_pipe_mbps, relayed_worker
from bench.machine import CpuWindow
from bench.run import PAYLOAD, Bench
from bench.stats import Figure, Target, latency_row, timed

DIRECT = "direct pipe"
TWO_HOP = "two-hop floor"
NDJSON = "toolhost ndjson"
MSGPACK = "toolhost msgpack"
WEBSOCKET = "toolhost websocket"


def _size_label(size: int) -> str:
    return f"{size // (1 << 20)} MB" if size >= 1 << 20 else f"{size // 1024} KB"


def _measure_host(
    b: Bench, fn: Callable[[], Any], calls: int, warmup: int
) -> tuple[list[float], dict[str, float]]:
    """Warm up, then time ``calls`` calls; returns (latencies s, host CPU µs per call)."""
    for _ in range(warmup):
        fn()
    cpu = CpuWindow(b.host.pid).start()
    samples = timed(fn, calls, 0)
    cpu.stop()
    return samples, cpu.per_call_us(calls)


def floors(b: Bench) -> None:
    """Scenario 1: the direct pipe round trip and the two-hop floor, one call in flight."""
    s = b.settings
    line = call_line(PAYLOAD)
    with direct_worker() as w:
        if b'"ok":true' not in w.roundtrip(line):
            raise RuntimeError("the echo worker did not answer ok")
        b.results.add(
            latency_row("floors", DIRECT, timed(partial(w.roundtrip, line), s.calls, s.warmup))
        )
        b.results.figure(
            Figure("floors", "echo worker start (spawn to ready)", w.start_s * 1000.0, "ms")
        )
    with relayed_worker() as c:
        if b'"ok":true' not in c.roundtrip(line):
            raise RuntimeError("the echo worker behind the relay did not answer ok")
        samples = timed(partial(c.roundtrip, line), s.calls, s.warmup)
        b.results.add(latency_row("floors", TWO_HOP, samples, baseline=DIRECT))


def e2e(b: Bench) -> None:
    """Scenario 2: toolhost end to end, one call in flight, on all three client kinds."""
    s = b.settings
    host = b.host
    request = invoke_request("bench.echo", PAYLOAD)

    c = LineClient(host.connect())
    try:
        req = ndjson(request)
        check_envelope(c.roundtrip(req))
        samples, cpu = _measure_host(b, partial(c.roundtrip, req), s.calls, s.warmup)
        check_envelope(c.roundtrip(req))
    finally:
        c.close()
    row = latency_row("e2e", NDJSON, samples, baseline=TWO_HOP, **cpu)
    row.target = Target("p50 <= 2.0x two-hop floor", 2.0)
    b.results.add(row)

    m = MsgpackClient(host.connect())
    try:
        frame = msgpack_frame(request)
        check_envelope(m.roundtrip(frame), binary=True)
        samples, cpu = _measure_host(b, partial(m.roundtrip, frame), s.calls, s.warmup)
    finally:
        m.close()
    b.results.add(latency_row("e2e", MSGPACK, samples, baseline=TWO_HOP, **cpu))

    if host.ws_port is None:
        return  # the reason is in the notes
    ws = WsClient("127.0.0.1", host.ws_port, host.ws_token())
    try:
        text = msgspec.json.encode(request)
        check_envelope(ws.roundtrip_text(text))
        samples, cpu = _measure_host(b, partial(ws.roundtrip_text, text), s.calls, s.warmup)
    finally:
        ws.close()
    b.results.add(latency_row("e2e", WEBSOCKET, samples, baseline=TWO_HOP, **cpu))


def payload(b: Bench) -> None:
    """Scenario 5: 1 KB, 64 KB, 1 MB inputs and outputs, toolhost NDJSON next to the raw pipe.

    MB/s is the payload size over the p50 round trip (the payload crosses each way once).
    """
    sizes = b.settings.payload_calls
    c = LineClient(b.host.connect())
    try:
        with direct_worker() as w:
            for size, calls in sizes.items():
                label = _size_label(size)
                data = "x" * size
                warmup = max(3, calls // 10)
                line = call_line(data)
                if b'"ok":true' not in w.roundtrip(line)[:64]:
                    raise RuntimeError(f"echo worker failed a {label} payload")
                pipe = latency_row(
                    "payload", f"{DIRECT} {label}", timed(partial(w.roundtrip, line), calls, warmup)
                )
                assert pipe.stats is not None
                pipe.extra["mbps"] = size / pipe.stats.p50
                b.results.add(pipe)

                req = ndjson(invoke_request("bench.echo", data))
                env = check_envelope(c.roundtrip(req))
                if len(env["data"]["payload"]) != size:
                    raise RuntimeError(f"toolhost did not echo the whole {label} payload")
                samples, cpu = _measure_host(b, partial(c.roundtrip, req), calls, warmup)
                row = latency_row(
                    "payload",
                    f"{NDJSON} {label}",
                    samples,
                    baseline=pipe.name,
                    **cpu,
                )
                assert row.stats is not None
                row.extra["mbps"] = size / row.stats.p50
                row.extra["pipeShare"] = row.extra["mbps"] / pipe.extra["mbps"]
                if size >= 1 << 20:
                    row.target = Target("MB/s >= 0.5x direct pipe", 0.5, "ge")
                    row.target_on = "pipeShare"
                b.results.add(row)
                b.results.figure(
                    Figure(
                        "payload",
                        f"bare OS pipe bandwidth, {label} blocks",
                        raw_pipe_mbps(size, max(8, (64 << 20) // size)),
                        "MB/s",
                        note="one-way memory copy through a kernel pipe, no worker: context only",
                    )
                )
    finally:
        c.close()
