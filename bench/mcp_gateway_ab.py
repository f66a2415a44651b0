"""The MCP gateway before/after in one process: ``python -m bench.mcp_gateway_ab --base TREE``.

# Strategy: the ratios of ``toolhost bench --only mcp_gateway`` move by +-0.3 between runs on
# the shared machine, more than a change to the gateway moves them; this harness measures a
# base tree and this tree in the same process, the rows taking turns request by request. It
# starts one ``toolhost serve`` per tree (:class:`bench.host.BenchHost` with ``tree``), each
# hosting ``gw`` (``bench/sidecars/gateway_mcp.py``) and toolhost's SDK echo, and holds one
# official-SDK
# ``Client`` session (mode ``auto``: the modern era, response cache off) on ``gw`` spawned
# directly and one on each tree's ``toolhost mcp`` (stdio; ``--embedded`` adds each tree's
# ``toolhost mcp --embedded``). CPU per request of every process comes from per-thread
# ``/proc/<pid>/task/*/schedstat`` (ns, exact), not from the 10 ms ticks of ``/proc/<pid>/stat``.
# Prints one JSON record (``--out`` writes it too). The base tree is any checkout, e.g.
# ``git archive BASE | tar -x -C /tmp/base`` (it runs with this tree's interpreter).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any

from bench.floors import SIDECARS
from bench.host import BenchHost
from bench.machine import REPO
from bench.mcp_gateway_client import PAYLOAD, Op, children
from bench.run import SIDECAR_ENTRIES

URI = "blob://gw/1mb"


def cpu_ns(pid: int) -> int:
    """CPU time of every thread of ``pid`` in ns (schedstat), 0 when it is gone."""
    total = 0
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return 0
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/schedstat", encoding="ascii") as f:
                total += int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            continue
    return total


def _descendants(pid: int) -> dict[int, str]:
    """Every process under ``pid`` (children first): pid -> command line."""
    out: dict[int, str] = {}
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/children", encoding="ascii") as f:
                kids = [int(k) for k in f.read().split()]
        except OSError:
            continue
        for kid in kids:
            try:
                with open(f"/proc/{kid}/cmdline", "rb") as c:
                    out[kid] = c.read().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            out.update(_descendants(kid))
    return out


def _params(argv: list[str], cwd: Path, env: dict[str, str] | None = None) -> Any:
    from mcp import StdioServerParameters

    return StdioServerParameters(
        command=sys.executable, args=argv, env={**os.environ, **(env or {})}, cwd=str(cwd)
    )


async def _interleaved(
    ops: dict[str, Op], n: int, warmup: int, pids: dict[str, dict[str, int]]
) -> dict[str, dict[str, Any]]:
    """``n`` timed requests per row, the rows taking turns request by request (the order
    rotating), so load drift hits every row alike; each row's processes (``pids``: none shared
    between the rows of one phase) and this one are read before and after: CPU per request."""
    for op in ops.values():
        for _ in range(warmup):
            await op()
    names = list(ops)
    samples: dict[str, list[float]] = {name: [] for name in names}
    me = os.getpid()
    before = {(name, k): cpu_ns(p) for name in names for k, p in pids[name].items()}
    mine = cpu_ns(me)
    clock = time.perf_counter
    for i in range(n):
        shift = i % len(names)
        for name in names[shift:] + names[:shift]:
            t = clock()
            await ops[name]()
            samples[name].append(clock() - t)
    client = (cpu_ns(me) - mine) / 1000 / n / len(names)
    rows: dict[str, dict[str, Any]] = {}
    for name in names:
        cpu = {k: round((cpu_ns(p) - before[name, k]) / 1000 / n, 1) for k, p in pids[name].items()}
        rows[name] = {
            "n": n,
            "p50Us": statistics.median(samples[name]) * 1e6,
            "p90Us": statistics.quantiles(samples[name], n=10)[-1] * 1e6,
            "meanUs": statistics.fmean(samples[name]) * 1e6,
            "cpuUs": {**cpu, "client (mean of the rows)": round(client, 1)},
        }
    return rows


async def measure(a: argparse.Namespace, hosts: dict[str, BenchHost]) -> dict[str, Any]:
    from contextlib import AsyncExitStack

    from mcp.client.client import Client

    trees = {"base": Path(a.base), "head": REPO}
    async with AsyncExitStack() as stack:
        direct = await stack.enter_async_context(
            Client(
                _params([str(SIDECARS / "gateway_mcp.py")], REPO, {"GW_NAME": "gw"}),
                mode="auto",
                cache=None,
            )
        )
        faces: dict[str, Any] = {}
        for tree, host in hosts.items():
            modes: list[tuple[str, list[str]]] = [("", [])] + (
                [("emb", ["--embedded", "--settle", "60"])] if a.embedded else []
            )
            for suffix, extra in modes:
                root = host.embedded_root if suffix else host.root  # one host per app root
                argv = ["-m", "supervisor", "mcp", *extra, "--app-root", str(root)]
                env = {"XDG_CONFIG_HOME": str(root / ".xdg")}
                params = _params([*argv, "--no-global"], trees[tree], env)
                name = tree + (f" {suffix}" if suffix else "")
                faces[name] = await stack.enter_async_context(
                    Client(params, mode="auto", cache=None)
                )
        args = {"payload": PAYLOAD}
        for name, client in [("direct", direct), *faces.items()]:
            tools = ["gw_echo"] if name == "direct" else ["gw_echo", "bench.echo"]
            for tool in tools:
                got = await client.call_tool(tool, args)
                if got.is_error or (got.structured_content or {}).get("payload") != PAYLOAD:
                    raise RuntimeError(f"{name} {tool}: unexpected answer {got}")
            read = await client.read_resource(URI, cache_mode="bypass")
            if len(getattr(read.contents[0], "text", "")) != 1 << 20:
                raise RuntimeError(f"{name}: {URI} is not 1 MiB")
        kids = children()
        pids: dict[str, dict[str, int]] = {}
        server = next(p for p, c in kids.items() if "gateway_mcp.py" in c)
        pids["direct"] = {"server": server}
        for name in faces:
            tree = name.split()[0]
            host = hosts[tree]
            face = next(
                p
                for p, c in kids.items()
                if " mcp " in c
                and str(host.embedded_root if name.endswith("emb") else host.root) in c
                and ("--embedded" in c) == name.endswith("emb")
            )
            if name.endswith("emb"):  # the host is the face; its workers are the face's
                workers = _descendants(face)
                gw = next(p for p, c in workers.items() if "gateway_mcp.py" in c)
                # The SDK echo is forked by the zygote (as the face's child, with the zygote's
                # command line), after the zygote itself: the newer of the two.
                zygotes = [p for p, c in workers.items() if "zygote_main" in c]
                echo = max(zygotes) if len(zygotes) > 1 else 0
                pids[name] = {"face": face, "server": gw}
                pids[name + " sdk"] = {"face": face, "echo": echo}
                continue
            pids[name] = {"face": face, "serve": host.pid, "server": host.worker_pids("gw")[0]}
            pids[name + " sdk"] = {
                "face": face,
                "serve": host.pid,
                "echo": host.worker_pids("echo")[0],
            }
        out: dict[str, Any] = {"pids": pids}
        calls: dict[str, Op] = {"direct": lambda: direct.call_tool("gw_echo", args)}
        sdk: dict[str, Op] = {}
        reads: dict[str, Op] = {"direct": lambda: direct.read_resource(URI, cache_mode="bypass")}
        for name, client in faces.items():
            calls[name] = partial(client.call_tool, "gw_echo", args)
            sdk[name + " sdk"] = partial(client.call_tool, "bench.echo", args)
            reads[name] = partial(client.read_resource, URI, cache_mode="bypass")
        out["calls"] = await _interleaved(calls, a.calls, a.calls // 10, pids)
        out["calls"].update(await _interleaved(sdk, a.calls, a.calls // 10, pids))
        out["reads"] = await _interleaved(reads, a.reads, 3, pids)
    for kind in ("calls", "reads"):
        rows = out[kind]
        for row in rows.values():
            row["ratio"] = round(row["p50Us"] / rows["direct"]["p50Us"], 3)
    return out


def main(argv: list[str] | None = None) -> int:
    import anyio

    p = argparse.ArgumentParser(prog="python -m bench.mcp_gateway_ab")
    p.add_argument("--base", required=True, help="the base checkout (run with this interpreter)")
    p.add_argument("--calls", type=int, default=600, help="timed tools/call per row")
    p.add_argument("--reads", type=int, default=60, help="timed 1 MiB resources/read per row")
    p.add_argument("--embedded", action="store_true", help="also each tree's --embedded face")
    p.add_argument("--out", type=Path)
    a = p.parse_args(argv)
    sidecars = {k: SIDECAR_ENTRIES[k] for k in ("echo", "gw")}
    hosts: dict[str, BenchHost] = {}
    load = [os.getloadavg()]
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    try:
        for tree, path in (("base", Path(a.base)), ("head", REPO)):
            hosts[tree] = BenchHost(sidecars, tree=path).start()
            hosts[tree].wait_tools(["gw_echo", "bench.echo"])
            hosts[tree].wait_workers("gw", 1)
        out = anyio.run(measure, a, hosts)
    finally:
        for host in hosts.values():
            host.stop()
    load.append(os.getloadavg())
    record = {
        "schema": "toolhost-mcp-ab/2",
        "command": "python -m bench.mcp_gateway_ab " + " ".join(argv or sys.argv[1:]),
        "base": a.base,
        "time": started,
        "loadavg": {"start": load[0], "end": load[1]},
        **out,
    }
    text = json.dumps(record, indent=1)
    if a.out is not None:
        a.out.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
