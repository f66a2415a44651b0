"""``--only compare --against TREE``: this tree's call path against another checkout's, in one run.

A refactoring that must not change speed (issue 27's redesign, say) is judged by ratios taken in
the same run, not by figures from another day on a shared machine.

# Strategy: each round starts one ``toolhost serve`` from each tree in turn (the order alternates
# so neither tree always runs second), each with its own interpreter (``TREE/.venv/bin/python``
# when the tree has a venv) and its own bench echo sidecar, so the SDK measured is the tree's
# own. In each host: the NDJSON round trip with one call in flight (p50 and host CPU per call,
# as in ``e2e``), then one connection keeping 8 calls in flight on a pool of two
# concurrency-1 workers (the SDK default, as in ``throughput``). The rows are the medians over
# rounds; the figures are this tree's median over the other's (1.00 = the same).
"""

from __future__ import annotations

import statistics
import sys
from functools import partial
from pathlib import Path
from typing import Any

from bench.clients import LineClient, PipelinedClient, check_envelope, invoke_request, ndjson
from bench.host import BenchHost
from bench.machine import REPO, CpuWindow
from bench.run import PAYLOAD, Bench, echo_sidecar
from bench.stats import Figure, Row, Stats, Target, timed

WINDOW = 8
"""Calls in flight in the throughput part."""
E2E_TOOL = "bench.echo"
TP_TOOL = "bench.echo.c1w2"


def tree_python(tree: Path) -> str:
    """The interpreter a tree runs with: its own venv's, else this one."""
    venv = tree / ".venv" / "bin" / "python"
    return str(venv) if venv.exists() else sys.executable


def _sidecars(tree: Path) -> dict[str, Any]:
    echo = str(tree / "bench" / "sidecars" / "echo.py")
    return {
        "echo": echo_sidecar(E2E_TOOL) | {"args": [echo]},
        "c1w2": echo_sidecar(TP_TOOL, workers=2) | {"args": [echo]},
    }


def _one_tree(b: Bench, tree: Path) -> dict[str, float]:
    s = b.settings
    with BenchHost(_sidecars(tree), tree=tree, python=tree_python(tree)) as host:
        host.wait_tools([E2E_TOOL, TP_TOOL])
        host.wait_workers("echo", 1)
        host.wait_workers("c1w2", 2)
        c = LineClient(host.connect())
        try:
            req = ndjson(invoke_request(E2E_TOOL, PAYLOAD))
            check_envelope(c.roundtrip(req))
            for _ in range(s.warmup):
                c.roundtrip(req)
            cpu = CpuWindow(host.pid).start()
            lat = timed(partial(c.roundtrip, req), s.calls, 0)
            cpu.stop()
        finally:
            c.close()
        sock = host.connect()
        try:
            client = PipelinedClient(sock, TP_TOOL, PAYLOAD, WINDOW)
            client.run(max(WINDOW * 4, s.calls // 10))
            tp_cpu = CpuWindow(host.pid).start()
            tp_lat, elapsed, bad = client.run(s.calls)
            tp_cpu.stop()
        finally:
            sock.close()
    if bad:
        raise RuntimeError(f"{tree}: {bad} calls failed in the throughput part")
    return {
        "e2eP50Us": Stats.of(lat).p50,
        "e2eCpuUs": cpu.seconds / s.calls * 1e6,
        "tpRate": s.calls / elapsed,
        "tpP50Us": Stats.of(tp_lat).p50,
        "tpCpuUs": tp_cpu.seconds / s.calls * 1e6,
    }


FIGURES = {
    "e2eP50Us": "e2e NDJSON p50, one in flight",
    "e2eCpuUs": "e2e NDJSON host CPU per call, one in flight",
    "tpP50Us": f"2 c1 workers, {WINDOW} in flight: p50",
    "tpCpuUs": f"2 c1 workers, {WINDOW} in flight: host CPU per call",
    "tpRate": f"2 c1 workers, {WINDOW} in flight: calls/s",
}


def compare(b: Bench) -> None:
    """This tree against ``--against``, ``--rounds`` rounds alternating the order."""
    other = b.settings.against
    if other is None:
        raise RuntimeError("compare needs --against TREE (a checkout of the commit to compare)")
    trees = {"other": other.resolve(), "this": REPO}
    runs: dict[str, list[dict[str, float]]] = {"other": [], "this": []}
    for r in range(b.settings.rounds):
        order = ["other", "this"] if r % 2 == 0 else ["this", "other"]
        for label in order:
            b.log(f"compare round {r + 1}/{b.settings.rounds}: {label} ({trees[label]})")
            runs[label].append(_one_tree(b, trees[label]))
    for label in ("other", "this"):
        med = {k: statistics.median(x[k] for x in runs[label]) for k in FIGURES}
        b.results.add(
            Row(
                scenario="compare",
                name=f"{label}: {trees[label]}",
                extra={**med, "rounds": [dict(x) for x in runs[label]]},
            )
        )
    for key, what in FIGURES.items():
        this = statistics.median(x[key] for x in runs["this"])
        base = statistics.median(x[key] for x in runs["other"])
        b.results.figure(
            Figure(
                "compare",
                f"{what}: this / other",
                this / base,
                "x",
                target=Target(">= 0.95x", 0.95, "ge")
                if key == "tpRate"
                else Target("<= 1.05x", 1.05),
                note=f"median of {b.settings.rounds} rounds: {this:.1f} vs {base:.1f}",
            )
        )
