"""The MCP peer's own number: the official ``mcp`` SDK client calling the echo server directly.

``python -m bench.mcp_direct --calls N --warmup W --payload-bytes P`` spawns
``bench/sidecars/echo_mcp.py`` over stdio with ``mcp.client.stdio.stdio_client``, initializes a
``ClientSession``, times N ``tools/call`` round trips after W warm-up calls and prints
``{"samples": [seconds...], "startS": ...}`` as one JSON line. It runs in its own process under
anyio's default (asyncio) backend, never inside trio.

``--via toolhost --app-root R --tool T`` drives ``toolhost mcp`` (stdio, a kernel client of the
host running on R) instead, ``--via embedded`` ``toolhost mcp --embedded`` (its own host on R),
and ``--via http --url U --token-file F --tool T`` a ``toolhost mcp --http`` endpoint, with the
same client and the same loop (``bench.mcp_server``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from bench.floors import SIDECARS


@asynccontextmanager
async def _transport(a: argparse.Namespace) -> AsyncIterator[tuple[Any, Any]]:
    from mcp import StdioServerParameters, stdio_client

    if a.via == "http":
        import httpx2
        from mcp.client.streamable_http import streamable_http_client

        headers = {"Authorization": f"Bearer {a.token}"}
        async with (
            httpx2.AsyncClient(headers=headers, timeout=60) as client,
            streamable_http_client(a.url, http_client=client) as streams,
        ):
            yield streams[0], streams[1]
        return
    if a.via in ("toolhost", "embedded"):
        args = ["-m", "supervisor", "mcp", "--app-root", a.app_root, "--no-global"]
        if a.via == "embedded":
            args.append("--embedded")
    else:
        args = [str(SIDECARS / "echo_mcp.py")]
    params = StdioServerParameters(command=sys.executable, args=args)
    async with stdio_client(params) as (read, write):
        yield read, write


async def measure(a: argparse.Namespace, payload: str) -> dict[str, object]:
    from mcp.client.session import ClientSession

    calls, warmup, tool = a.calls, a.warmup, a.tool
    t0 = time.perf_counter()
    async with _transport(a) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        start_s = time.perf_counter() - t0
        args = {"payload": payload}
        first = await session.call_tool(tool, args)
        if first.is_error or (first.structured_content or {}).get("payload") != payload:
            raise RuntimeError(f"unexpected answer: {first}")
        for _ in range(warmup):
            await session.call_tool(tool, args)
        samples = []
        clock = time.perf_counter
        for _ in range(calls):
            t = clock()
            await session.call_tool(tool, args)
            samples.append(clock() - t)
    return {"samples": samples, "startS": start_s}


def main(argv: list[str] | None = None) -> int:
    import anyio

    p = argparse.ArgumentParser(prog="python -m bench.mcp_direct")
    p.add_argument("--calls", type=int, default=1000)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--payload-bytes", type=int, default=64)
    p.add_argument("--via", choices=["direct", "toolhost", "embedded", "http"], default="direct")
    p.add_argument("--tool", default="bench_echo_mcp")
    p.add_argument("--app-root", help="--via toolhost|embedded: the app root")
    p.add_argument("--url", help="--via http: the MCP endpoint")
    p.add_argument("--token-file", help="--via http: the bearer token file")
    a = p.parse_args(argv)
    if a.via == "http":
        with open(a.token_file, encoding="utf-8") as f:
            a.token = f.read().strip()
    out = anyio.run(measure, a, "x" * a.payload_bytes)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
