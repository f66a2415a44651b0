"""Scenario 4: foreign baselines on the same echo tool.

- Flyflor-style oneshot (a process per call) and Fractalic-style simple-json: both hosted by
  toolhost, and spawned per call straight from plain Python (the spawn-per-call host's own
  best case: the clock stops at the answer line, reaping is not timed);
- an MCP server (written with the official SDK) hosted by toolhost, and the same server driven
  directly by the SDK's own client (:mod:`bench.mcp_direct`, in its own process).

Every row's ratio is its p50 over toolhost's NDJSON p50 (scenario 2): how many times slower.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from functools import partial

from bench.clients import LineClient, check_envelope, invoke_request, ndjson
from bench.floors import ECHO, SIDECARS, echo_env
from bench.latency import NDJSON
from bench.mcp_server import drive_mcp_direct
from bench.run import PAYLOAD, Bench
from bench.stats import Target, latency_row, timed

ONESHOT_DIRECT = "oneshot, spawned per call (direct)"
MCP_DIRECT = "mcp server, official SDK client (direct)"


def _spawn_oneshot(request: bytes, env: dict[str, str]) -> float:
    """One Flyflor oneshot call from plain Python; seconds until the answer line."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, str(ECHO)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env
    )
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(request)
    proc.stdin.close()
    answer = proc.stdout.readline()
    elapsed = time.perf_counter() - t0
    proc.stdout.close()
    proc.wait()
    if b'"ok":true' not in answer:
        raise RuntimeError(f"oneshot echo failed: {answer[:200]!r}")
    return elapsed


def _spawn_simple(arg: str) -> float:
    """One Fractalic simple-json call from plain Python; seconds until the answer."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, str(SIDECARS / "echo_simple.py"), arg], stdout=subprocess.PIPE
    )
    assert proc.stdout is not None
    answer = proc.stdout.readline()
    elapsed = time.perf_counter() - t0
    proc.stdout.close()
    proc.wait()
    if b"payload" not in answer:
        raise RuntimeError(f"simple-json echo failed: {answer[:200]!r}")
    return elapsed


def _hosted(b: Bench, tool: str, name: str, calls: int) -> None:
    c = LineClient(b.host.connect())
    try:
        req = ndjson(invoke_request(tool, PAYLOAD))
        check_envelope(c.roundtrip(req))
        samples = timed(partial(c.roundtrip, req), calls, max(2, calls // 10))
        check_envelope(c.roundtrip(req))
    finally:
        c.close()
    b.results.add(latency_row("foreign", name, samples, baseline=NDJSON))


def _spawned(fn: partial[float], calls: int) -> list[float]:
    for _ in range(max(2, calls // 10)):
        fn()
    return [fn() for _ in range(calls)]


def foreign(b: Bench) -> None:
    s = b.settings
    # Hosted by toolhost.
    _hosted(b, "bench.echo.oneshot", "oneshot via toolhost", s.spawn_calls)
    _hosted(b, "bench.echo.simple", "simple-json via toolhost", s.spawn_calls)
    _hosted(b, "bench_echo_mcp", "mcp server via toolhost", s.mcp_calls)

    # The peers' own numbers.
    request = (
        json.dumps(
            {
                "tool": "bench.echo.oneshot",
                "input": {"payload": PAYLOAD},
                "config": {},
                "cwd": os.getcwd(),
                "projectDir": os.getcwd(),
                "configDir": os.getcwd(),
            }
        ).encode()
        + b"\n"
    )
    env = echo_env(tool="bench.echo.oneshot")
    row = latency_row(
        "foreign",
        ONESHOT_DIRECT,
        _spawned(partial(_spawn_oneshot, request, env), s.spawn_calls),
        baseline=NDJSON,
    )
    row.target = Target("toolhost p50 >= 100x lower", 100.0, "ge")
    b.results.add(row)
    arg = json.dumps({"payload": PAYLOAD})
    b.results.add(
        latency_row(
            "foreign",
            "simple-json, spawned per call (direct)",
            _spawned(partial(_spawn_simple, arg), s.spawn_calls),
            baseline=NDJSON,
        )
    )
    samples, start_s = drive_mcp_direct(b)
    row = latency_row("foreign", MCP_DIRECT, samples, baseline=NDJSON, startS=start_s)
    row.target = Target("toolhost p50 >= 10x lower", 10.0, "ge")
    b.results.add(row)
