"""The MCP peer's own number: the official ``mcp`` SDK client calling the echo server directly.

``python -m bench.mcp_direct --calls N --warmup W --payload-bytes P`` spawns
``bench/sidecars/echo_mcp.py`` over stdio with ``mcp.client.stdio.stdio_client``, initializes a
``ClientSession``, times N ``tools/call`` round trips after W warm-up calls and prints
``{"samples": [seconds...], "startS": ...}`` as one JSON line. It runs in its own process under
anyio's default (asyncio) backend, never inside trio.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from bench.floors import SIDECARS


async def measure(calls: int, warmup: int, payload: str) -> dict[str, object]:
    from mcp import StdioServerParameters, stdio_client
    from mcp.client.session import ClientSession

    params = StdioServerParameters(command=sys.executable, args=[str(SIDECARS / "echo_mcp.py")])
    t0 = time.perf_counter()
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        start_s = time.perf_counter() - t0
        args = {"payload": payload}
        first = await session.call_tool("bench_echo_mcp", args)
        if first.is_error or (first.structured_content or {}).get("payload") != payload:
            raise RuntimeError(f"unexpected answer: {first}")
        for _ in range(warmup):
            await session.call_tool("bench_echo_mcp", args)
        samples = []
        clock = time.perf_counter
        for _ in range(calls):
            t = clock()
            await session.call_tool("bench_echo_mcp", args)
            samples.append(clock() - t)
    return {"samples": samples, "startS": start_s}


def main(argv: list[str] | None = None) -> int:
    import anyio

    p = argparse.ArgumentParser(prog="python -m bench.mcp_direct")
    p.add_argument("--calls", type=int, default=1000)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--payload-bytes", type=int, default=64)
    a = p.parse_args(argv)
    out = anyio.run(measure, a.calls, a.warmup, "x" * a.payload_bytes)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
