"""Zygote vs exec, in one run (issue 20): spawn -> ready, 150 sidecars, replacement, memory.

Run ``python -m bench.zygote`` (``--sidecars 150 --starts 30``; ``--out FILE`` writes the JSON
record). Every figure is measured both ways in the same process run, alternating, and reported
as a ratio: exec / zygote for times (higher is better), zygote / exec for memory.

# Strategy: an in-process :class:`~supervisor.host.host.Host` per measurement (this process is
# the host, as under ``toolhost serve``), on a registry in a temp folder whose sidecars differ
# only in ``spawn``. ``startMs`` is the worker status field (start request -> ``ready``); the
# 150-sidecar time is host start -> every tool available, woken by the host's change events;
# memory is ``Pss`` from ``/proc/PID/smaps_rollup`` (shared pages split between their users).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import msgspec
import trio

from supervisor.calls.call import InvokeRequest
from supervisor.host.host import Host, build_host
from supervisor.host.loading import HostOptions

ECHO = ["-m", "bench.sidecars.echo"]
UTILITY = ["-m", "sidecars.utility"]
UTILITY_TOOLS = ["file.hash", "archive.create", "archive.extract", "data.convert"]


def pss_kb(pid: int) -> int:
    """Proportional set size of ``pid`` in KiB (0 when unreadable)."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def _write(root: Path, sidecars: dict[str, Any], **host: Any) -> None:
    path = root / "tools" / "external.tools.jsonc"
    path.parent.mkdir(parents=True, exist_ok=True)
    host = {"zygote": {"replyTimeoutMs": 1000}, "maxConcurrentSpawns": 4, **host}
    path.write_text(json.dumps({"schemaVersion": 2, "host": host, "sidecars": sidecars}))


class _Running:
    def __init__(self, root: Path) -> None:
        self.options = HostOptions(
            app_root=str(root), use_global=False, manifest_dirs=[], audit=False
        )
        self.host: Host

    async def start(self, nursery: trio.Nursery) -> Host:
        self.host = await build_host(self.options)
        await nursery.start(self.host.run)
        return self.host

    async def wait(self, pred: Any, limit_s: float = 120) -> None:
        with trio.fail_after(limit_s):
            while not pred():
                await self.host.feed.wait_change()


async def _with_host(root: Path, body: Any) -> Any:
    run = _Running(root)
    async with trio.open_nursery() as nursery:
        await run.start(nursery)
        try:
            return await body(run)
        finally:
            run.host.stop()
            with trio.move_on_after(30):
                await run.host.wait_stopped()
            nursery.cancel_scope.cancel()


def _workers(host: Host, sid: str) -> list[Any]:
    return next(s for s in host.views.snapshot().sidecars if s.id == sid).workers


async def spawn_to_ready(root: Path, spawn: str, starts: int) -> list[float]:
    """``startMs`` of ``starts`` consecutive starts of the bundled utility worker."""
    _write(
        root,
        {
            "utility": {
                "command": "python",
                "args": UTILITY,
                "tools": UTILITY_TOOLS,
                "spawn": spawn,
                "restart": {"backoffMs": 0, "intensity": 1000},
                "probe": {"intervalMs": 0},
            }
        },
        zygote={"replyTimeoutMs": 1000, "preload": ["sidecars.utility"]},
    )

    async def body(run: _Running) -> list[float]:
        host = run.host
        out: list[float] = []
        seen: set[int] = set()
        for _ in range(starts):

            def ready() -> Any:
                ws = _workers(host, "utility")
                return ws and ws[0].state == "ready" and ws[0].pid not in seen

            await run.wait(ready)
            w = _workers(host, "utility")[0]
            assert w.startedBy == spawn.replace("auto", "zygote"), w
            out.append(float(w.startMs or 0.0))
            seen.add(w.pid)
            os.kill(w.pid, signal.SIGKILL)
        return out

    return await _with_host(root, body)


async def many_sidecars(root: Path, spawn: str, n: int) -> dict[str, Any]:
    """Host start -> all ``n`` one-worker sidecars available; then every process's Pss."""
    _write(
        root,
        {
            f"s{i}": {
                "command": "python",
                "args": ECHO,
                "tools": [f"bench.e{i}"],
                "env": {"ECHO_TOOL": f"bench.e{i}"},
                "spawn": spawn,
            }
            for i in range(n)
        },
        zygote={"replyTimeoutMs": 1000, "preload": ["bench.sidecars.echo"]},
    )
    t0 = time.perf_counter()
    run = _Running(root)
    result: dict[str, Any] = {}
    async with trio.open_nursery() as nursery:
        host = await run.start(nursery)
        tools = [f"bench.e{i}" for i in range(n)]

        def available() -> bool:
            for t in tools:
                d = host.catalog.get(t)
                if d is None or d.stability.effective != "available":
                    return False
            return True

        await run.wait(available, limit_s=300)
        result["allAvailableS"] = time.perf_counter() - t0
        await trio.sleep(1.0)  # let the workers go idle before measuring memory
        pids = [w.pid for s in host.views.snapshot().sidecars for w in s.workers]
        by = [w.startedBy for s in host.views.snapshot().sidecars for w in s.workers]
        worker_pss = [pss_kb(p) for p in pids]
        zpid = host.zygote.pid if host.zygote is not None else None
        result.update(
            workers=len(pids),
            startedBy=sorted(set(by)),
            workerPssKbMedian=statistics.median(worker_pss),
            hostPssKb=pss_kb(os.getpid()),
            zygotePssKb=pss_kb(zpid) if zpid and spawn == "auto" else 0,
        )
        result["totalPssKb"] = result["hostPssKb"] + result["zygotePssKb"] + sum(worker_pss)
        host.stop()
        with trio.move_on_after(60):
            await host.wait_stopped()
        nursery.cancel_scope.cancel()
    return result


async def replacement(root: Path, spawn: str, rounds: int) -> list[dict[str, float]]:
    """64 calls in flight, SIGKILL the worker: how long until the replacement answers a call.

    ``afterBackoffMs`` is the time from the replacement's start request (the end of the
    jittered backoff) to the first answer; ``killToAnswerMs`` includes the backoff.
    """
    _write(
        root,
        {
            "e": {
                "command": "python",
                "args": ECHO,
                "tools": ["bench.echo"],
                "env": {"ECHO_CONCURRENCY": "64"},
                "spawn": spawn,
                "restart": {"backoffMs": 100, "intensity": 1000},
                "pool": {"queue": 256},
            }
        },
        zygote={"replyTimeoutMs": 1000, "preload": ["bench.sidecars.echo"]},
    )

    async def body(run: _Running) -> list[dict[str, float]]:
        return [await _one_replacement(run) for _ in range(rounds)]

    return await _with_host(root, body)


async def _one_replacement(run: _Running) -> dict[str, float]:
    host = run.host
    payload = msgspec.Raw(b'{"payload": "x"}')
    await run.wait(lambda: any(w.state == "ready" for w in _workers(host, "e")))
    victim = _workers(host, "e")[0].pid
    pool = host.pools["e"]
    first: list[float] = []

    async def call() -> None:
        await host.invoker.invoke(InvokeRequest("bench.echo", payload, timeout_ms=10_000))

    async def after() -> None:
        env = await host.invoker.invoke(InvokeRequest("bench.echo", payload, timeout_ms=10_000))
        if env.status == "success" and env.meta.pid != victim:
            first.append(trio.current_time())

    async with trio.open_nursery() as n:
        for _ in range(64):
            n.start_soon(call)
        await trio.lowlevel.checkpoint()
        t_kill = trio.current_time()
        os.kill(victim, signal.SIGKILL)
        await run.wait(
            lambda: (
                pool.statistics().last_exit is not None
                and victim not in [w.pid for w in pool.workers]
            )
        )
        n.start_soon(after)
    new = next(w for w in pool.workers if w.pid != victim)
    return {
        "killToAnswerMs": (first[0] - t_kill) * 1000.0 if first else -1.0,
        "afterBackoffMs": (first[0] - new.started_at) * 1000.0 if first else -1.0,
    }


def _median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else 0.0


async def main(args: argparse.Namespace) -> dict[str, Any]:
    record: dict[str, Any] = {"schema": "toolhost-bench-zygote/1", "cpus": os.cpu_count()}
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        starts: dict[str, list[float]] = {}
        for spawn in ("exec", "auto", "exec", "auto"):  # alternate: load drifts hit both
            got = await spawn_to_ready(base / f"s-{spawn}-{len(starts)}", spawn, args.starts)
            starts.setdefault(spawn, []).extend(got)
        record["spawnToReadyMs"] = {
            k: {"p50": _median(v), "min": min(v), "max": max(v), "n": len(v)}
            for k, v in starts.items()
        }
        record["spawnToReadyRatio"] = _median(starts["exec"]) / max(_median(starts["auto"]), 1e-9)
        many = {}
        for spawn in ("exec", "auto"):
            many[spawn] = await many_sidecars(base / f"m-{spawn}", spawn, args.sidecars)
        record["manySidecars"] = many
        record["manySidecarsRatio"] = many["exec"]["allAvailableS"] / many["auto"]["allAvailableS"]
        record["workerPssRatio"] = (
            many["auto"]["workerPssKbMedian"] / many["exec"]["workerPssKbMedian"]
        )
        record["totalPssRatio"] = many["auto"]["totalPssKb"] / many["exec"]["totalPssKb"]
        rep = {}
        for spawn in ("exec", "auto"):
            rep[spawn] = await replacement(base / f"r-{spawn}", spawn, args.rounds)
        record["replacement"] = {
            k: {
                "killToAnswerMsP50": _median([r["killToAnswerMs"] for r in v]),
                "afterBackoffMsP50": _median([r["afterBackoffMs"] for r in v]),
                "afterBackoffMsMax": max(r["afterBackoffMs"] for r in v),
            }
            for k, v in rep.items()
        }
    return record


def cli(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.zygote", description=__doc__)
    p.add_argument("--sidecars", type=int, default=150)
    p.add_argument("--starts", type=int, default=30, help="starts per way, per round (2 rounds)")
    p.add_argument("--rounds", type=int, default=5, help="replacement rounds per way")
    p.add_argument("--out", help="write the JSON record here")
    args = p.parse_args(argv)
    record = trio.run(main, args)
    text = json.dumps(record, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(cli())
