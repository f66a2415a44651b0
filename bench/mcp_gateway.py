"""Scenario ``mcp_gateway``: the MCP gateway's targets of issue 29, as ratios in one run.

The shared ``toolhost serve`` hosts five SDK-written MCP servers (``bench/sidecars/
gateway_mcp.py`` as ``gw``, ``s2`` .. ``s5``) and toolhost's SDK echo (``bench.echo``). One
client process (:mod:`bench.mcp_gateway_client`, the official SDK's ``Client`` in the modern
era, response cache off) holds a session on the same server spawned directly and one on
``toolhost mcp`` (stdio, socket-connected) and one on ``toolhost mcp --embedded`` (its own host
in-process on the same registry), and alternates blocks of requests between them:

- ``tools/call`` of ``gw_echo`` (64-byte payload) through the gateway vs directly: p50 <= 1.3x;
  next to it, the same call (and the read below) through :mod:`bench.relay` (a process that
  only copies bytes): the floor any gateway in the middle starts from on this machine;
- ``resources/read`` of the 1 MiB ``blob://gw/1mb`` through the gateway vs directly: <= 1.3x;
- ``tools/call`` of ``bench.echo`` (toolhost's SDK) through the gateway vs the direct SDK
  ``tools/call``: <= 0.7x;
- ``tools/list`` and ``resources/list`` through the gateway while ``s5`` is stopped (SIGSTOP)
  with a ``resources/read`` of it pending: every one under 50 ms (the bound is on the slowest).
"""

from __future__ import annotations

import json
import subprocess
import sys

from bench.machine import REPO
from bench.run import Bench
from bench.stats import Figure, Target, latency_row

DIRECT = "gateway: SDK client -> SDK server (direct), tools/call"
RELAY = "gateway: SDK client -> plain relay -> SDK server, tools/call (the floor of one hop)"
CALL = "gateway: SDK client -> toolhost mcp -> SDK server, tools/call"
CALL_SDK = "gateway: SDK client -> toolhost mcp -> toolhost SDK echo, tools/call"
CALL_EMB = "gateway: SDK client -> toolhost mcp --embedded -> SDK server, tools/call"
CALL_SDK_EMB = "gateway: SDK client -> toolhost mcp --embedded -> toolhost SDK echo, tools/call"
READ_EMB = "gateway: SDK client -> toolhost mcp --embedded -> SDK server, resources/read 1 MiB"
READ_DIRECT = "gateway: SDK client -> SDK server (direct), resources/read 1 MiB"
READ = "gateway: SDK client -> toolhost mcp -> SDK server, resources/read 1 MiB"
READ_RELAY = "gateway: SDK client -> plain relay -> SDK server, resources/read 1 MiB (the floor)"
TOOLS_LIST = "gateway: tools/list, 1 of 5 servers hanging"
RESOURCES_LIST = "gateway: resources/list, 1 of 5 servers hanging"
HANGING = "s5"
LIST_LIMIT_US = 50_000.0


def mcp_gateway(b: Bench) -> None:
    host = b.host
    [hang_pid] = host.wait_workers(HANGING, 1)
    s = b.settings
    calls = s.mcp_calls
    argv = [
        sys.executable,
        "-m",
        "bench.mcp_gateway_client",
        "--app-root",
        str(host.root),
        "--embedded-root",
        str(host.embedded_root),
        "--hang-pid",
        str(hang_pid),
        "--hang-name",
        HANGING,
        "--calls",
        str(calls),
        "--warmup",
        str(max(10, calls // 10)),
        "--reads",
        str(20 if s.quick else 100),
        "--lists",
        str(40 if s.quick else 200),
        "--rounds",
        str(4 if s.quick else 10),
        "--pid",
        f"toolhost serve={host.pid}",
        "--pid",
        f"hosted gw={host.worker_pids('gw')[0]}",
        "--pid",
        f"toolhost SDK echo={host.worker_pids('echo')[0]}",
    ]
    out = subprocess.run(argv, capture_output=True, text=True, cwd=str(REPO), timeout=900)
    if out.returncode != 0:
        raise RuntimeError(f"bench.mcp_gateway_client failed:\n{out.stderr[-3000:]}")
    got = json.loads(out.stdout.strip().splitlines()[-1])
    c, r, lists = got["calls"], got["reads"], got["lists"]
    add = b.results.add
    cc, rc = got["callsCpuUs"], got["readsCpuUs"]
    add(latency_row("mcp_gateway", DIRECT, c["direct"], eras=got["eras"], cpuUs=cc["direct"]))
    add(latency_row("mcp_gateway", RELAY, c["relay"], baseline=DIRECT, cpuUs=cc["relay"]))
    row = add(latency_row("mcp_gateway", CALL, c["gateway"], baseline=DIRECT, cpuUs=cc["gateway"]))
    row.target = Target("gateway tools/call p50 <= 1.3x direct", 1.3, "le")
    row = add(
        latency_row(
            "mcp_gateway", CALL_SDK, c["gateway_sdk"], baseline=DIRECT, cpuUs=cc["gateway_sdk"]
        )
    )
    row.target = Target("toolhost SDK echo via the gateway p50 <= 0.7x SDK direct", 0.7, "le")
    add(latency_row("mcp_gateway", READ_DIRECT, r["direct"], cpuUs=rc["direct"]))
    add(latency_row("mcp_gateway", READ_RELAY, r["relay"], baseline=READ_DIRECT, cpuUs=rc["relay"]))
    row = add(
        latency_row("mcp_gateway", READ, r["gateway"], baseline=READ_DIRECT, cpuUs=rc["gateway"])
    )
    row.target = Target("gateway resources/read 1 MiB p50 <= 1.3x direct", 1.3, "le")
    for name, key, base, target in (
        (CALL_EMB, "embedded", DIRECT, Target("embedded tools/call p50 <= 1.3x direct", 1.3, "le")),
        (
            CALL_SDK_EMB,
            "embedded_sdk",
            DIRECT,
            Target("embedded toolhost SDK echo p50 <= 0.7x SDK direct", 0.7, "le"),
        ),
    ):
        row = add(latency_row("mcp_gateway", name, c[key], baseline=base, cpuUs=cc[key]))
        row.target = target
    emb = latency_row(
        "mcp_gateway", READ_EMB, r["embedded"], baseline=READ_DIRECT, cpuUs=rc["embedded"]
    )
    row = add(emb)
    row.target = Target("embedded resources/read 1 MiB p50 <= 1.3x direct", 1.3, "le")
    listed = got["listed"]
    for name, key in ((TOOLS_LIST, "tools"), (RESOURCES_LIST, "resources")):
        row = add(latency_row("mcp_gateway", name, lists[key], listed=len(listed[key])))
        row.extra["maxUs"] = row.stats.max if row.stats else None
        row.target_on = "maxUs"
        row.target = Target(f"{key}/list with a server hanging: slowest < 50 ms", LIST_LIMIT_US)
    hidden = [n for n in listed["tools"] if n.startswith(f"{HANGING}_")]
    b.results.figure(
        Figure(
            "mcp_gateway",
            "gateway: tools of the hanging server still listed",
            float(len(hidden)),
            "tools",
            note="answered from what the host knows; the server was stopped: "
            + str(listed["hangingStopped"]),
        )
    )
