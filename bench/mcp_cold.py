"""What a hosted call costs the host next to a slow peer: ``python -m bench.mcp_cold``.

# Strategy: ``toolhost serve``'s CPU per hosted ``tools/call`` of an SDK-written MCP server
# (``gw``) read ~1.6x its CPU per call of toolhost's SDK echo, with the same face and gates
# (bench/README.md, session 6). This asks whether that is the MCP client code or the peer: one
# ``toolhost serve`` hosts ``gw``, the SDK echo, and the same SDK echo that sleeps
# (``idle``: the host waits without anything else running) or spins (``busy``: another process
# uses the CPU meanwhile) ``--peer-ms`` per call (``bench/sidecars/echo_idle.py``). One official
# SDK ``Client`` calls each through ``toolhost mcp`` (the adopted stdio session, modern era) in
# blocks, the order rotating each round; per block, the p50 and ``toolhost serve``'s and the
# tool's worker's CPU per call (per-thread schedstat, exact). Same code in the host for the three
# echoes: a difference between them is the peer's doing, not the host's code.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from bench.floors import SIDECARS
from bench.host import BenchHost
from bench.machine import REPO
from bench.mcp_gateway_ab import _params, cpu_ns
from bench.mcp_gateway_client import PAYLOAD
from bench.run import SIDECAR_ENTRIES, echo_sidecar

TOOLS = {
    "gw": "gw_echo",
    "echo": "bench.echo",
    "idle": "bench.echo.idle",
    "busy": "bench.echo.busy",
}


def _slow(tool: str, **env: str) -> dict[str, Any]:
    entry = echo_sidecar(tool)
    entry["args"] = [str(SIDECARS / "echo_idle.py")]
    entry["env"].update(env)
    return entry


async def measure(a: argparse.Namespace, host: BenchHost) -> dict[str, Any]:
    from mcp.client.client import Client

    argv = ["-m", "supervisor", "mcp", "--app-root", str(host.root), "--no-global"]
    params = _params(argv, REPO, {"XDG_CONFIG_HOME": str(host.root / ".xdg")})
    workers = {name: host.worker_pids(name)[0] for name in TOOLS}
    rows: dict[str, dict[str, list[float]]] = {
        n: {"samples": [], "serve": [], "worker": []} for n in TOOLS
    }
    args = {"payload": PAYLOAD}
    async with Client(params, mode="auto", cache=None) as client:
        for tool in TOOLS.values():
            got = await client.call_tool(tool, args)
            if got.is_error or (got.structured_content or {}).get("payload") != PAYLOAD:
                raise RuntimeError(f"{tool}: unexpected answer {got}")
        names = list(TOOLS)
        for r in range(a.rounds):
            for name in names[r % len(names) :] + names[: r % len(names)]:
                tool, row = TOOLS[name], rows[name]
                for _ in range(a.calls // 10):
                    await client.call_tool(tool, args)
                serve, worker = cpu_ns(host.pid), cpu_ns(workers[name])
                for _ in range(a.calls):
                    t = time.perf_counter()
                    await client.call_tool(tool, args)
                    row["samples"].append(time.perf_counter() - t)
                row["serve"].append((cpu_ns(host.pid) - serve) / 1000 / a.calls)
                row["worker"].append((cpu_ns(workers[name]) - worker) / 1000 / a.calls)
    return {
        name: {
            "tool": TOOLS[name],
            "n": len(row["samples"]),
            "p50Us": round(statistics.median(row["samples"]) * 1e6),
            "serveCpuUs": [round(x) for x in row["serve"]],
            "workerCpuUs": [round(x) for x in row["worker"]],
        }
        for name, row in rows.items()
    }


def main(argv: list[str] | None = None) -> int:
    import anyio

    p = argparse.ArgumentParser(prog="python -m bench.mcp_cold")
    p.add_argument("--calls", type=int, default=1000, help="timed tools/call per block")
    p.add_argument("--rounds", type=int, default=2, help="blocks per tool (order rotating)")
    p.add_argument("--peer-ms", default="3", help="what idle sleeps and busy spins per call")
    p.add_argument("--out", type=Path)
    a = p.parse_args(argv)
    sidecars = {
        "gw": SIDECAR_ENTRIES["gw"],
        "echo": SIDECAR_ENTRIES["echo"],
        "idle": _slow(TOOLS["idle"], ECHO_SLEEP_MS=a.peer_ms),
        "busy": _slow(TOOLS["busy"], ECHO_SPIN_MS=a.peer_ms),
    }
    load = [os.getloadavg()]
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    host = BenchHost(sidecars).start()
    try:
        host.wait_tools(list(TOOLS.values()))
        for name in TOOLS:
            host.wait_workers(name, 1)
        rows = anyio.run(measure, a, host)
    finally:
        host.stop()
    load.append(os.getloadavg())
    record = {
        "schema": "toolhost-mcp-cold/1",
        "command": "python -m bench.mcp_cold " + " ".join(argv or sys.argv[1:]),
        "time": started,
        "loadavg": {"start": load[0], "end": load[1]},
        "rows": rows,
    }
    text = json.dumps(record, indent=1)
    if a.out is not None:
        a.out.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
