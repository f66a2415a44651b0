"""Scenarios 6-8: cold start of the bundled registry, recovery from a SIGKILLed worker, and the
memory footprint of the host and its workers.
"""

from __future__ import annotations

import os
import signal
import socket
import statistics
import threading
import time
from collections import Counter

import msgspec

from bench.clients import LineClient, PipelinedClient, invoke_request, ndjson
from bench.host import BenchHost
from bench.machine import CpuWindow, RssSampler, rss_bytes
from bench.run import PAYLOAD, RECOVERY_BACKOFF_MS, Bench, tool_of
from bench.stats import Figure, Target
from supervisor.cli.init import bundled_registry

MB = float(1 << 20)
COLD_START_TARGET_MS = 1000.0
REPLACE_SLACK_MS = 150.0
IDLE_RSS_TARGET_MB = 80.0


def _ready_times(host: BenchHost, timeout_s: float = 30.0) -> dict[str, float]:
    """perf_counter time at which each sidecar was first seen ``ready``.

    Event driven: read the catalog, then block until the next ``catalog.changed`` event (an
    event consumed while waiting for a response came before that response, so the catalog read
    already reflects it). A timer closes the connection if the sidecars never all get ready.
    """
    c = host.control
    c.request("capability.catalog.subscribe")
    seen: dict[str, float] = {}
    watchdog = threading.Timer(timeout_s, lambda: c.sock.shutdown(socket.SHUT_RDWR))
    watchdog.start()
    try:
        while True:
            now = time.perf_counter()
            sidecars = c.request("capability.catalog.get")["sidecars"]
            for s in sidecars:
                if s["runtime"] == "ready" and s["id"] not in seen:
                    seen[s["id"]] = now
            if sidecars and len(seen) == len(sidecars):
                return seen
            if not c.rfile.readline():
                raise TimeoutError(f"sidecars never all ready within {timeout_s} s: {sidecars}")
    finally:
        watchdog.cancel()


def cold_start(b: Bench) -> None:
    """Scenario 6: ``toolhost serve`` on the bundled registry until every sidecar is ready."""
    runs: list[dict[str, float]] = []
    idle_rss: list[float] = []
    for _ in range(b.settings.cold_runs):
        # The registry the package bundles (what `toolhost init` writes), in the bench's own app
        # root: never the operator's tools/, whose host.ws or socket would bind their addresses.
        host = BenchHost(bundled_registry()["sidecars"])
        try:
            host.start()
            ready = _ready_times(host)
            run = {sid: (t - host.spawned_at) * 1000.0 for sid, t in ready.items()}
            run["(socket up: toolhost serving)"] = (host.serving_at - host.spawned_at) * 1000.0
            run["(total)"] = max(run.values())
            runs.append(run)
            time.sleep(0.3)
            idle_rss.append(rss_bytes(host.pid) / MB)
        finally:
            host.stop()
    keys = list(runs[0])
    for key in keys:
        values = [r[key] for r in runs if key in r]
        name = {
            "(total)": "cold start, bundled registry: every sidecar ready",
            "(socket up: toolhost serving)": "cold start: socket up (toolhost serving)",
        }.get(key, f"cold start: sidecar {key} ready")
        b.results.figure(
            Figure(
                "cold_start",
                name,
                statistics.median(values),
                "ms",
                target=(
                    Target(f"< {COLD_START_TARGET_MS:g} ms", COLD_START_TARGET_MS)
                    if key == "(total)"
                    else None
                ),
                note=f"median of {len(values)} run(s): " + ", ".join(f"{v:.0f}" for v in values),
            )
        )
    b.results.figure(
        Figure(
            "cold_start",
            "host RSS idle, bundled registry",
            statistics.median(idle_rss),
            "MB",
        )
    )


class _Meta(msgspec.Struct):
    pid: int | None = None


class _Error(msgspec.Struct):
    code: str = "?"


class _Envelope(msgspec.Struct):
    status: str = "?"
    error: _Error | None = None
    meta: _Meta = msgspec.field(default_factory=_Meta)


class _Answer(msgspec.Struct):
    result: _Envelope = msgspec.field(default_factory=_Envelope)


_decode = msgspec.json.Decoder(_Answer).decode


def replacement_ready(host: BenchHost, sidecar: str, old: int) -> float | None:
    """When (``time.perf_counter``) the first worker of ``sidecar`` other than ``old`` became
    ready, from its ``uptimeMs`` and ``startMs``; never later than the true moment (the clock is
    read before the status request, and the host measures uptime after it)."""
    asked = time.perf_counter()
    moments = [
        asked - (w["uptimeMs"] - w["startMs"]) / 1000.0
        for w in host.sidecar(sidecar)["workers"]
        if w.get("pid") != old and w.get("startMs") is not None
    ]
    return min(moments, default=None)


def wait_after_ready(calls: list[tuple[float, float]], ready: float) -> float:
    """The longest time (s) a call of ``calls`` (sent, answered) waited once the replacement
    was ready: its answer minus the later of its sending and ``ready``. The wait from sending
    and the restart from the kill start at different moments, so their difference says nothing
    (it went negative); only calls answered after ``ready`` count (the others failed on the
    dying worker)."""
    return max((d - max(s, ready) for s, d in calls if d >= ready), default=0.0)


def recovery(b: Bench) -> None:
    """Scenario 7: SIGKILL the worker while calls run; failed calls and time until served.

    One client calls the victim sidecar in a loop (one call in flight, no pause), the worker is
    SIGKILLed, and the loop goes on until a call succeeds on the replacement. Failed calls are
    counted by error code: the call on the dying worker fails ``worker-crashed``; inside the
    restart window (PROTOCOL 4) no call may be refused ``not-visible``: later calls wait in the
    queue for the replacement, and the longest such wait is reported next to the time the
    replacement took.
    """
    host = b.host
    req = ndjson(invoke_request(tool_of("victim"), PAYLOAD))
    failed: list[int] = []
    codes: Counter[str] = Counter()
    replaced_ms: list[float] = []
    ready_ms: list[float] = []
    longest_wait_ms: list[float] = []
    c = LineClient(host.connect())
    try:
        for _ in range(b.settings.kills):
            old = host.wait_workers("victim", 1)[0]
            time.sleep(0.6)  # past resetAfterMs, so the restart uses the base backoff
            answers: list[tuple[float, _Envelope]] = []
            waits: list[tuple[float, float]] = []
            stop = threading.Event()

            def loop(
                log: list[tuple[float, _Envelope]] = answers,
                sent_done: list[tuple[float, float]] = waits,
                done: threading.Event = stop,
            ) -> None:
                while not done.is_set():
                    sent = time.perf_counter()
                    env = _decode(c.roundtrip(req)).result
                    now = time.perf_counter()
                    log.append((now, env))
                    sent_done.append((sent, now))

            thread = threading.Thread(target=loop, daemon=True)
            thread.start()
            time.sleep(0.05)
            t_kill = time.perf_counter()
            os.kill(old, signal.SIGKILL)
            deadline = t_kill + 15.0
            back: float | None = None
            while back is None and time.perf_counter() < deadline:
                time.sleep(0.005)
                for t, env in list(answers):
                    if t > t_kill and env.status == "success" and env.meta.pid not in (old, None):
                        back = t
                        break
            stop.set()
            thread.join(timeout=20)
            ready = replacement_ready(host, "victim", old)
            after = [env for t, env in answers if t > t_kill and env.status != "success"]
            failed.append(len(after))
            codes.update(env.error.code if env.error else env.status for env in after)
            replaced_ms.append((back - t_kill) * 1000.0 if back is not None else float("inf"))
            ready_ms.append((ready - t_kill) * 1000.0 if ready is not None else float("inf"))
            queued = [(s, d) for s, d in waits if s > t_kill and (back is None or s < back)]
            beyond = wait_after_ready(queued, ready) if ready is not None else float("inf")
            longest_wait_ms.append(beyond * 1000.0)
    finally:
        c.close()
    limit = RECOVERY_BACKOFF_MS + REPLACE_SLACK_MS
    b.results.figure(
        Figure(
            "recovery",
            "calls refused not-visible per worker kill",
            codes.get("not-visible", 0) / max(1, len(failed)),
            "calls",
            target=Target("0 (the restart window keeps the tool visible)", 0.0),
        )
    )
    b.results.figure(
        Figure(
            "recovery",
            "longest wait of a call queued across the restart, after the replacement was ready",
            max(longest_wait_ms, default=0.0),
            "ms",
            target=Target("<= 50 ms (answered within backoff + replacement start + 50 ms)", 50.0),
            note="per kill, longest wait after ready / replacement ready after the kill (ms): "
            + ", ".join(f"{w:.1f}/{r:.0f}" for w, r in zip(longest_wait_ms, ready_ms)),
        )
    )
    b.results.figure(
        Figure(
            "recovery",
            "calls failed per worker kill",
            statistics.mean(failed),
            "calls",
            note=f"per kill: {failed}; by code: {dict(codes)} (a client calling in a tight loop)",
        )
    )
    b.results.figure(
        Figure(
            "recovery",
            "killed worker replaced and serving (worst kill)",
            max(replaced_ms),
            "ms",
            target=Target(f"<= backoff {RECOVERY_BACKOFF_MS} + {REPLACE_SLACK_MS:g} ms", limit),
            note=f"restart.backoffMs={RECOVERY_BACKOFF_MS} (full jitter: 0..backoff); per kill: "
            + ", ".join(f"{v:.0f}" for v in replaced_ms),
        )
    )


def footprint(b: Bench) -> None:
    """Scenario 8: host RSS idle and under load (64 in flight on 2 workers); RSS per worker."""
    host = b.host
    assert b.idle_rss is not None
    b.results.figure(
        Figure(
            "footprint",
            "host RSS idle",
            b.idle_rss / MB,
            "MB",
            target=Target(f"< {IDLE_RSS_TARGET_MB:g} MB", IDLE_RSS_TARGET_MB),
            note=f"toolhost serve with {len(b.needed_sidecars())} bench sidecars, all ready",
        )
    )
    idle_s = 0.5 if b.settings.quick else 2.0
    cpu = CpuWindow(host.pid).start()
    time.sleep(idle_s)
    cpu.stop()
    b.results.figure(
        Figure(
            "footprint",
            "host CPU while idle",
            cpu.seconds / idle_s * 100.0,
            "%",
            note=f"% of one core over {idle_s:g} s with no calls (probes and timers only)",
        )
    )
    sock = host.connect()
    try:
        client = PipelinedClient(sock, tool_of("tp2"), PAYLOAD, 64)
        with RssSampler(host.pid) as sampler:
            client.run(b.settings.throughput_calls)
    finally:
        sock.close()
    b.results.figure(
        Figure(
            "footprint",
            "host RSS under load (peak, 64 in flight)",
            sampler.peak / MB,
            "MB",
            note=f"{sampler.samples} samples",
        )
    )
    kinds = (("echo", "SDK echo"), ("tp2", "SDK echo, concurrency 64"), ("mcp", "MCP SDK server"))
    for sidecar, label in kinds:
        if sidecar not in b.needed_sidecars():
            continue
        pids = host.worker_pids(sidecar)
        if not pids:
            continue
        rss = [rss_bytes(p) / MB for p in pids]
        b.results.figure(
            Figure(
                "footprint",
                f"worker RSS: {label}",
                statistics.mean(rss),
                "MB",
                note=f"{len(pids)} worker(s): " + ", ".join(f"{v:.1f}" for v in rss),
            )
        )
    b.results.figure(
        Figure("footprint", "host RSS at the end of the load", rss_bytes(host.pid) / MB, "MB")
    )
