"""``toolhost bench`` (and ``python -m bench``): run the scenarios, print, record, plot.

Scenarios (``--only`` takes these keys; a scenario's baselines come along automatically):

==========  ==================================================================================
floors      direct pipe round trip and the two-hop floor (socket -> plain relay -> worker)
e2e         toolhost end to end, one call in flight: NDJSON, MessagePack, WebSocket
throughput  1/8/64 in flight on pools of 1 and 2 workers vs the pipelined single-hop floor
foreign     oneshot, simple-json and MCP (hosted and direct), MCP SDK client directly
payload     1 KB, 64 KB, 1 MB payloads vs the direct pipe's MB/s
cold_start  toolhost serve on the bundled registry until every sidecar is ready
recovery    SIGKILL a worker while calls run: calls failed, time until served again
footprint   host RSS idle and under load, RSS per worker
services    host services from a worker: child tools.invoke, state.get/set
compare     this tree's call path against ``--against TREE``'s, alternating, in one run
mcp_gateway the MCP gateway (issue 29): calls, 1 MiB reads, lists with a hosted server hanging
confine     confinement: the walls in a child; spawn -> ready, host CPU, web.fetch, confined and not
==========  ==================================================================================
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

SCENARIOS = [
    "floors",
    "e2e",
    "throughput",
    "foreign",
    "payload",
    "cold_start",
    "recovery",
    "footprint",
    "mcp_server",
    "mcp_gateway",
    "services",
    "compare",
    "confine",
]
OPT_IN = frozenset({"mcp_server", "mcp_gateway", "compare", "confine"})
"""Run only when named in ``--only``: ``mcp_server`` drives four official-SDK client processes
(seconds of imports each) and measures the MCP face, not the host's own latency; ``compare``
needs ``--against``; ``confine`` measures process starts, not the host."""
DEFAULT_SCENARIOS = [s for s in SCENARIOS if s not in OPT_IN]
ORDER = [
    "cold_start",  # before the shared host exists: nothing else runs meanwhile
    "floors",
    "e2e",
    "throughput",
    "foreign",
    "payload",
    "footprint",
    "mcp_server",
    "mcp_gateway",
    "services",
    "compare",  # hosts of its own, one per tree and round
    "confine",
    "recovery",  # last: it kills workers
]
DEPENDS = {"e2e": ["floors"], "foreign": ["e2e"]}
DEFAULT_OUT = Path(__file__).resolve().parent / "out" / "last.json"


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``toolhost bench`` (``supervisor/cli/main.py`` declares the same)."""
    p.add_argument("--quick", action="store_true", help="smoke run: few calls, well under 30 s")
    p.add_argument("--out", type=Path, help=f"JSON record (default {DEFAULT_OUT})")
    p.add_argument("--plot", type=Path, help="latency CDFs as PNG (needs the 'bench' extra)")
    p.add_argument("--calls", type=int, help="calls per latency row (default 10000)")
    p.add_argument("--only", nargs="+", metavar="SCENARIO", help="run only these scenarios")
    p.add_argument("--profile", type=Path, help="py-spy profile of the host (.svg/.json/.txt)")
    p.add_argument(
        "--against", type=Path, metavar="TREE", help="compare: the other checkout (its .venv)"
    )
    p.add_argument("--rounds", type=int, default=4, help="compare: rounds (default 4)")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n")[0])
    add_arguments(p)
    return p


def selected(only: list[str] | None) -> list[str]:
    """The scenarios to run, with their baselines' scenarios, in run order."""
    wanted = set(only or DEFAULT_SCENARIOS)
    unknown = wanted - set(SCENARIOS)
    if unknown:
        raise ValueError(
            f"unknown scenario(s) {', '.join(sorted(unknown))}; choose from {', '.join(SCENARIOS)}"
        )
    changed = True
    while changed:
        changed = False
        for key in list(wanted):
            for dep in DEPENDS.get(key, []):
                if dep not in wanted:
                    wanted.add(dep)
                    changed = True
    return [k for k in ORDER if k in wanted]


def _functions() -> dict[str, Callable[..., None]]:
    from bench import (
        compare,
        confine,
        foreign,
        latency,
        lifecycle,
        mcp_gateway,
        mcp_server,
        services,
        throughput,
    )

    return {
        "floors": latency.floors,
        "e2e": latency.e2e,
        "throughput": throughput.throughput,
        "foreign": foreign.foreign,
        "payload": latency.payload,
        "cold_start": lifecycle.cold_start,
        "recovery": lifecycle.recovery,
        "footprint": lifecycle.footprint,
        "mcp_server": mcp_server.mcp_server,
        "mcp_gateway": mcp_gateway.mcp_gateway,
        "services": services.services,
        "compare": compare.compare,
        "confine": confine.confine,
    }


def run(args: argparse.Namespace) -> int:
    """Run the bench; exit status 0 when every selected scenario ran (targets do not count)."""
    from bench.machine import git_info, machine_info
    from bench.report import have_matplotlib, plot, print_tables, record, sanitize, write_json
    from bench.run import Bench, Settings

    try:
        keys = selected(args.only)
    except ValueError as exc:
        print(f"toolhost bench: {exc}", file=sys.stderr)
        return 64
    if args.calls is not None and args.calls < 1:
        print("toolhost bench: --calls must be >= 1", file=sys.stderr)
        return 64
    plot_path: Path | None = args.plot
    if plot_path is not None and not have_matplotlib():
        print(
            "toolhost bench: --plot needs matplotlib (pip install 'toolhost[bench]'); "
            "running without the plot",
            file=sys.stderr,
        )
        plot_path = None
    settings = Settings.make(quick=args.quick, calls=args.calls)
    settings.against = getattr(args, "against", None)
    settings.rounds = max(1, getattr(args, "rounds", 4))
    bench = Bench(settings, keys)
    bench.profile = getattr(args, "profile", None)
    machine = machine_info()
    functions = _functions()
    t0 = time.perf_counter()
    try:
        for key in keys:
            bench.log(f"{key} ...")
            t = time.perf_counter()
            try:
                functions[key](bench)
            except Exception as exc:
                traceback.print_exc(file=sys.stderr)
                bench.results.errors[key] = f"{type(exc).__name__}: {exc}"
            bench.log(f"{key} done in {time.perf_counter() - t:.1f} s")
    finally:
        bench.close()
    duration = time.perf_counter() - t0
    results = bench.results
    results.resolve()
    print_tables(results, sys.stdout)
    out: Path = args.out or DEFAULT_OUT
    meta = {
        "quick": settings.quick,
        "durationS": round(duration, 2),
        "command": "toolhost bench "
        + " ".join(sys.argv[2:] if sys.argv[1:2] == ["bench"] else sys.argv[1:]),
        "machine": machine,
        "git": git_info(),
        "settings": {
            k: str(v) if isinstance(v, Path) else v
            for k, v in asdict(settings).items()
            if k != "payload_calls"
        }
        | {"payload_calls": {str(k): v for k, v in settings.payload_calls.items()}},
    }
    write_json(
        out,
        sanitize(
            record(
                results,
                scenarios=keys,
                all_scenarios=DEFAULT_SCENARIOS + [k for k in keys if k in OPT_IN],
                meta=meta,
            )
        ),
    )
    print(f"\nrecord: {out} ({duration:.1f} s)")
    if plot_path is not None:
        plot(results, plot_path)
        print(f"plot: {plot_path}")
    return 1 if results.errors else 0


def main(argv: list[str] | None = None) -> int:
    return run(build_parser().parse_args(argv))
