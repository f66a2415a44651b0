"""The client side of ``bench/mcp_gateway.py``: the official SDK client, modern era, in its own
process, holding two sessions at once and alternating between them in blocks.

``python -m bench.mcp_gateway_client --app-root R --hang-pid P [--calls N --reads M --lists L]``:

- ``direct``: ``Client`` (mode ``auto``, so ``server/discover`` and the 2026-07-28 revision) on
  ``bench/sidecars/gateway_mcp.py`` spawned over stdio;
- ``gateway``: the same ``Client`` on ``toolhost mcp --app-root R`` over stdio, a kernel client
  of the bench's ``toolhost serve`` that hosts the same server (``gw``) among five, and
  toolhost's own SDK echo (``bench.echo``);
- ``embedded``: the same ``Client`` on ``toolhost mcp --embedded --app-root R``, which runs its
  own host in-process on the same registry (one process fewer on the path).

Blocks of calls alternate between the rows (the order turning each round), so load drift on the
shared machine hits every row alike. Then ``P`` (one of the five hosted servers) is stopped with
SIGSTOP, a ``resources/read`` of it is left hanging in the gateway, and ``tools/list`` and
``resources/list`` are timed through the gateway; SIGCONT at the end. The client's response
cache is off (``cache=None``) and lists pass ``cache_mode="bypass"``: every request reaches the
server. Prints one JSON line: samples in seconds per row, and what the lists held.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

from bench.floors import SIDECARS

MODERN = "2026-07-28"
GAP_S = float(os.environ.get("TOOLHOST_BENCH_GAP_MS", "0")) / 1000.0
"""Idle time before each timed request (not timed): ``TOOLHOST_BENCH_GAP_MS=10`` measures calls
as an agent makes them, each after a pause, every process in the chain resuming cold."""


async def _sleep(s: float) -> None:
    import anyio

    await anyio.sleep(s)


PAYLOAD = "x" * 64

Op = Callable[[], Awaitable[Any]]


def _params(argv: list[str], env: dict[str, str] | None = None) -> Any:
    from mcp import StdioServerParameters

    return StdioServerParameters(
        command=sys.executable, args=argv, env={**os.environ, **(env or {})}
    )


def cpu_us(pid: int) -> int:
    """utime + stime of ``pid`` in µs (clock ticks of 10 ms), 0 when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0
    return (int(fields[11]) + int(fields[12])) * 10_000


def children() -> dict[int, str]:
    """This process's children (the direct server, ``toolhost mcp``): pid -> command line."""
    out: dict[int, str] = {}
    for task in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{task}/children", encoding="ascii") as f:
            for pid in f.read().split():
                with open(f"/proc/{pid}/cmdline", "rb") as c:
                    out[int(pid)] = c.read().replace(b"\0", b" ").decode(errors="replace")
    return out


async def _blocks(
    ops: dict[str, Op], per_row: int, warmup: int, rounds: int, pids: dict[str, int]
) -> tuple[dict[str, list[float]], dict[str, dict[str, float]]]:
    """Each op ``warmup`` times, then ``per_row`` timed calls per row in ``rounds`` blocks,
    rows alternating (the order rotated each round); the samples, and the CPU µs per request
    each process of ``pids`` (and this one) spent during each row's blocks."""
    for op in ops.values():
        for _ in range(warmup):
            await op()
    names = list(ops)
    samples: dict[str, list[float]] = {n: [] for n in names}
    cpu: dict[str, dict[str, float]] = {n: dict.fromkeys([*pids, "client"], 0.0) for n in names}
    clock = time.perf_counter
    block = max(1, per_row // rounds)
    me = os.getpid()
    for r in range(rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            op, out = ops[name], samples[name]
            before = {k: cpu_us(p) for k, p in pids.items()} | {"client": cpu_us(me)}
            for _ in range(block):
                if GAP_S:
                    await _sleep(GAP_S)
                t = clock()
                await op()
                out.append(clock() - t)
            after = {k: cpu_us(p) for k, p in pids.items()} | {"client": cpu_us(me)}
            for k in after:
                cpu[name][k] += (after[k] - before[k]) / (block * rounds)
    return samples, cpu


def _stopped(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("T", "t")
    except OSError:
        return False


async def measure(a: argparse.Namespace) -> dict[str, Any]:
    import anyio
    from mcp.client.client import Client

    direct_params = _params([str(SIDECARS / "gateway_mcp.py")], {"GW_NAME": "gw"})
    # The floor of any gateway: the same server behind a process that only copies bytes.
    relay_argv = ["-m", "bench.relay", "-", sys.executable, str(SIDECARS / "gateway_mcp.py")]
    relay_params = _params(relay_argv, {"GW_NAME": "gw"})
    gateway_params = _params(
        ["-m", "supervisor", "mcp", "--app-root", a.app_root, "--no-global"],
        {"XDG_CONFIG_HOME": os.path.join(a.app_root, ".xdg")},
    )
    embedded_argv = ["-m", "supervisor", "mcp", "--embedded", "--settle", "60"]
    embedded_params = _params(
        [*embedded_argv, "--app-root", a.embedded_root, "--no-global"],
        {"XDG_CONFIG_HOME": os.path.join(a.embedded_root, ".xdg")},
    )
    out: dict[str, Any] = {}
    async with (
        Client(direct_params, mode="auto", cache=None) as direct,
        Client(relay_params, mode="auto", cache=None) as relay,
        Client(gateway_params, mode="auto", cache=None) as gateway,
        Client(embedded_params, mode="auto", cache=None) as embedded,
    ):
        out["eras"] = {
            "direct": direct.protocol_version,
            "relay": relay.protocol_version,
            "gateway": gateway.protocol_version,
            "embedded": embedded.protocol_version,
        }
        if set(out["eras"].values()) != {MODERN}:
            raise RuntimeError(f"not the modern era: {out['eras']}")
        args = {"payload": PAYLOAD}
        checks = [(direct, "gw_echo"), (relay, "gw_echo"), (gateway, "gw_echo")]
        checks += [(gateway, "bench.echo"), (embedded, "gw_echo"), (embedded, "bench.echo")]
        for client, tool in checks:
            got = await client.call_tool(tool, args)
            if got.is_error or (got.structured_content or {}).get("payload") != PAYLOAD:
                raise RuntimeError(f"{tool}: unexpected answer {got}")
        uri = "blob://gw/1mb"
        for client in (direct, relay, gateway, embedded):
            read = await client.read_resource(uri, cache_mode="bypass")
            text = getattr(read.contents[0], "text", "")
            if len(text) != 1 << 20:
                raise RuntimeError(f"{uri}: {len(text)} characters, not 1 MiB")

        pids = dict(a.pid or [])
        for pid, cmd in children().items():
            if "bench.relay" in cmd:
                pids["plain relay"] = pid
            elif "gateway_mcp.py" in cmd:
                pids["direct server"] = pid
            elif "--embedded" in cmd:
                pids["toolhost mcp --embedded"] = pid
            else:
                pids["toolhost mcp"] = pid
        out["pids"] = pids
        calls: dict[str, Op] = {
            "direct": lambda: direct.call_tool("gw_echo", args),
            "relay": lambda: relay.call_tool("gw_echo", args),
            "gateway": lambda: gateway.call_tool("gw_echo", args),
            "gateway_sdk": lambda: gateway.call_tool("bench.echo", args),
            "embedded": lambda: embedded.call_tool("gw_echo", args),
            "embedded_sdk": lambda: embedded.call_tool("bench.echo", args),
        }
        out["calls"], out["callsCpuUs"] = await _blocks(calls, a.calls, a.warmup, a.rounds, pids)
        reads: dict[str, Op] = {
            "direct": lambda: direct.read_resource(uri, cache_mode="bypass"),
            "relay": lambda: relay.read_resource(uri, cache_mode="bypass"),
            "gateway": lambda: gateway.read_resource(uri, cache_mode="bypass"),
            "embedded": lambda: embedded.read_resource(uri, cache_mode="bypass"),
        }
        out["reads"], out["readsCpuUs"] = await _blocks(
            reads, a.reads, max(2, a.reads // 10), a.rounds, pids
        )

        # One of the five hosted servers hangs: stopped, with a read of it pending in the host.
        os.kill(a.hang_pid, signal.SIGSTOP)
        try:
            with anyio.fail_after(5):
                # No event tells another process's stop; /proc shows it within a tick or two.
                while not _stopped(a.hang_pid):  # noqa: ASYNC110
                    await anyio.sleep(0.001)
            async with anyio.create_task_group() as tg:
                pending = anyio.Event()

                async def hanging_read() -> None:
                    pending.set()
                    try:
                        await gateway.read_resource(f"note://{a.hang_name}/readme")
                    except Exception:  # the host's deadline, or our cancel
                        pass

                tg.start_soon(hanging_read)
                await pending.wait()
                lists: dict[str, Op] = {
                    "tools": lambda: gateway.list_tools(cache_mode="bypass"),
                    "resources": lambda: gateway.list_resources(cache_mode="bypass"),
                }
                out["lists"], _ = await _blocks(lists, a.lists, 5, a.rounds, {})
                tools = (await gateway.list_tools(cache_mode="bypass")).tools
                resources = (await gateway.list_resources(cache_mode="bypass")).resources
                out["listed"] = {
                    "tools": sorted(t.name for t in tools),
                    "resources": sorted(str(r.uri) for r in resources),
                    "hangingStopped": _stopped(a.hang_pid),
                }
                tg.cancel_scope.cancel()
        finally:
            os.kill(a.hang_pid, signal.SIGCONT)
    return out


def main(argv: list[str] | None = None) -> int:
    import anyio

    p = argparse.ArgumentParser(prog="python -m bench.mcp_gateway_client")
    p.add_argument("--app-root", required=True)
    p.add_argument(
        "--embedded-root", required=True, help="the same registry's own root (one host per root)"
    )
    p.add_argument("--hang-pid", type=int, required=True)
    p.add_argument("--hang-name", default="s5")
    p.add_argument("--calls", type=int, default=2000)
    p.add_argument("--warmup", type=int, default=200)
    p.add_argument("--reads", type=int, default=100)
    p.add_argument("--lists", type=int, default=200)
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument(
        "--pid",
        action="append",
        type=lambda v: (v.split("=", 1)[0], int(v.split("=", 1)[1])),
        help="NAME=PID of a process whose CPU per request to record (repeatable)",
    )
    a = p.parse_args(argv)
    out = anyio.run(measure, a)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
