"""Scenario: host services (PROTOCOL 3.5) timed from inside a worker.

- a child ``tools.invoke`` round trip (worker -> host -> echo worker -> host -> worker) against
  a kernel-socket call of the same echo tool, one in flight, same run (target: at most 1.5x);
- ``state.get`` round trips with 10,000 keys stored (target: p50 under 100 µs);
- ``state.set`` one at a time (each answered after its own commit) and 32 in flight (commits
  batched), with ``synchronous=FULL`` (every answered write is on disk).
"""

from __future__ import annotations

import time
from typing import Any

import msgspec

from bench.clients import LineClient, invoke_request, ndjson
from bench.run import PAYLOAD, Bench, tool_of
from bench.stats import Figure, Row, Stats, Target

KEYS = 10_000


def _call(client: LineClient, input: dict[str, Any], timeout_ms: int = 600_000) -> Any:
    line = client.roundtrip(
        ndjson(
            {
                "id": 1,
                "method": "tools.invoke",
                "params": {"tool": "bench.services", "input": input, "timeoutMs": timeout_ms},
            }
        )
    )
    env = msgspec.json.decode(line)["result"]
    if env["status"] != "success":
        raise RuntimeError(f"bench.services {input.get('op')}: {env['content']}")
    return env["data"]


def services(b: Bench) -> None:
    s = b.settings
    n = max(200, s.calls // 5)
    keys = 1_000 if s.quick else KEYS
    host = b.host
    host.wait_workers("svc", 1)
    host.wait_workers("echo", 1)
    sock = host.connect()
    client = LineClient(sock)
    try:
        echo = tool_of("echo")
        line = ndjson(invoke_request(echo, PAYLOAD))
        for _ in range(200):
            client.roundtrip(line)
        lat = []
        for _ in range(n):
            t = time.perf_counter()
            client.roundtrip(line)
            lat.append(time.perf_counter() - t)
        kernel = Row(scenario="services", name="kernel socket call (echo)", stats=Stats.of(lat))
        b.results.add(kernel)
        child = _call(
            client, {"op": "invoke", "n": n, "tool": echo, "input": {"payload": PAYLOAD}}
        )["us"]
        row = Row(
            scenario="services",
            name="child tools.invoke from a worker (echo)",
            stats=Stats.of([u / 1e6 for u in child]),
            baseline=kernel.name,
            target=Target("p50 <= 1.5x the kernel-socket call", 1.5),
        )
        b.results.add(row)
        fill = _call(client, {"op": "fill", "n": keys, "window": 32})
        b.results.figure(
            Figure(
                "services",
                "state.set, 32 in flight (batched commits, synchronous=FULL)",
                keys / fill["seconds"],
                "writes/s",
            )
        )
        gets = _call(client, {"op": "get", "n": n, "keys": keys})["us"]
        b.results.add(
            Row(
                scenario="services",
                name=f"state.get round trip, {keys:,} keys",
                stats=Stats.of([u / 1e6 for u in gets]),
            )
        )
        p50 = sorted(gets)[len(gets) // 2]
        b.results.figure(
            Figure(
                "services",
                f"state.get p50, {keys:,} keys (worker round trip)",
                p50,
                "us",
                target=Target("< 100 us", 100.0),
            )
        )
        sets = _call(client, {"op": "set", "n": min(n, 500)})["us"]
        b.results.add(
            Row(
                scenario="services",
                name="state.set round trip, one at a time (synchronous=FULL)",
                stats=Stats.of([u / 1e6 for u in sets]),
            )
        )
    finally:
        client.close()
