"""Scenario ``mcp_server``: toolhost as an MCP server (issue 17), against the SDK's own server.

Three rows, all driven by the official ``mcp`` SDK client in its own process
(:mod:`bench.mcp_direct`, the same loop for each) with the same 64-byte payload:

- ``mcp: SDK client -> SDK server (direct)``: the plain SDK echo server over stdio (baseline);
- ``mcp: SDK client -> toolhost mcp (stdio)``: ``toolhost mcp`` spawned by the client, a kernel
  client of the bench's running ``toolhost serve``, calling the SDK echo sidecar ``bench.echo``;
  its ratio to the direct row is the issue's target (at most 0.7x: the SDK client dominates, our
  server side must not add to it);
- ``mcp: SDK client -> toolhost mcp --embedded``: the host in the MCP server's process (one
  process hop fewer), its own echo worker;
- ``mcp: SDK client -> toolhost mcp --http``: the same over Streamable HTTP, reported next to the
  kernel socket's NDJSON p50 measured in this scenario (``mcp: kernel socket ndjson``).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from functools import partial

from bench.clients import LineClient, check_envelope, invoke_request, ndjson
from bench.machine import REPO
from bench.run import PAYLOAD, Bench
from bench.stats import Target, latency_row, timed

DIRECT = "mcp: SDK client -> SDK server (direct)"
STDIO = "mcp: SDK client -> toolhost mcp (stdio)"
EMBEDDED = "mcp: SDK client -> toolhost mcp --embedded"
HTTP = "mcp: SDK client -> toolhost mcp --http"
KERNEL = "mcp: kernel socket ndjson"
MCP_CMD = [sys.executable, "-m", "supervisor", "mcp"]


def drive_mcp_direct(b: Bench, *via: str) -> tuple[list[float], float]:
    """Run :mod:`bench.mcp_direct` with ``via``; (samples in seconds, start seconds)."""
    s = b.settings
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.mcp_direct",
            "--calls",
            str(s.mcp_calls),
            "--warmup",
            str(max(10, s.mcp_calls // 10)),
            "--payload-bytes",
            str(len(PAYLOAD)),
            *via,
        ],
        capture_output=True,
        text=True,
        cwd=str(REPO),
        timeout=600,
    )
    if out.returncode != 0:
        raise RuntimeError(f"bench.mcp_direct {' '.join(via)} failed:\n{out.stderr[-2000:]}")
    result = json.loads(out.stdout.strip().splitlines()[-1])
    return [float(x) for x in result["samples"]], float(result["startS"])


def mcp_server(b: Bench) -> None:
    host = b.host
    root = str(host.root)
    # The kernel socket, same host, same tool, same payload.
    c = LineClient(host.connect())
    try:
        req = ndjson(invoke_request("bench.echo", PAYLOAD))
        check_envelope(c.roundtrip(req))
        calls = b.settings.mcp_calls
        samples = timed(partial(c.roundtrip, req), calls, max(10, calls // 10))
    finally:
        c.close()
    b.results.add(latency_row("mcp_server", KERNEL, samples))

    samples, start = drive_mcp_direct(b, "--via", "direct")
    b.results.add(latency_row("mcp_server", DIRECT, samples, startS=start))

    samples, start = drive_mcp_direct(
        b, "--via", "toolhost", "--app-root", root, "--tool", "bench.echo"
    )
    row = latency_row("mcp_server", STDIO, samples, baseline=DIRECT, startS=start)
    row.target = Target("toolhost mcp p50 <= 0.7x the SDK server's", 0.7, "le")
    b.results.add(row)

    samples, start = drive_mcp_direct(
        b, "--via", "embedded", "--app-root", str(host.embedded_root), "--tool", "bench.echo"
    )
    b.results.add(latency_row("mcp_server", EMBEDDED, samples, baseline=DIRECT, startS=start))

    proc = subprocess.Popen(
        [*MCP_CMD, "--app-root", root, "--no-global", "--http", "127.0.0.1:0"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        cwd=str(REPO),
    )
    try:
        assert proc.stderr is not None
        url = ""
        for raw in proc.stderr:
            found = re.search(rb"(http://\S+/mcp)", raw)
            if found:
                url = found.group(1).decode()
                break
        if not url:
            raise RuntimeError("toolhost mcp --http did not start")
        token_file = str(host.root / ".toolhost" / "mcp.token")
        samples, start = drive_mcp_direct(
            b, "--via", "http", "--url", url, "--token-file", token_file, "--tool", "bench.echo"
        )
    finally:
        proc.terminate()
        proc.wait(timeout=20)
    b.results.add(latency_row("mcp_server", HTTP, samples, baseline=KERNEL, startS=start))
