"""The state of one bench run: settings, results, and the host the scenarios share.

# Strategy: one ``toolhost serve`` serves every scenario that needs a host (starting a host per
# scenario would cost seconds and measure nothing new). Its registry holds only the sidecars the
# selected scenarios use, each serving the echo tool under its own name, so each configuration
# (pool size, concurrency, protocol) is one tool. The host starts lazily, before the first
# scenario that needs it; its idle footprint is sampled right after every tool is visible.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.floors import ECHO, SIDECARS
from bench.host import BenchHost
from bench.machine import rss_bytes
from bench.stats import Results

PAYLOAD = "x" * 64
"""The trivial echo payload (64 bytes) of the latency and throughput scenarios."""
THROUGHPUT_CONCURRENCY = 64
"""Calls in flight each throughput worker advertises (so the host, not the worker, decides)."""
RECOVERY_BACKOFF_MS = 100


@dataclass
class Settings:
    """How much to measure. ``quick`` is the smoke run (well under 30 s)."""

    quick: bool = False
    calls: int = 10_000
    """Calls per latency row (floors, end to end), after warm-up."""
    warmup: int = 1_000
    throughput_calls: int = 20_000
    spawn_calls: int = 100
    """Calls per spawn-per-call row (oneshot, simple-json)."""
    mcp_calls: int = 2_000
    payload_calls: dict[int, int] = field(
        default_factory=lambda: {1024: 2_000, 65_536: 1_000, 1 << 20: 100}
    )
    cold_runs: int = 3
    kills: int = 5
    against: Path | None = None
    """``compare``: the other checkout."""
    rounds: int = 4
    """``compare``: rounds, each starting one host per tree."""

    @classmethod
    def make(cls, *, quick: bool, calls: int | None) -> Settings:
        if quick:
            s = cls(
                quick=True,
                calls=1_000,
                warmup=200,
                throughput_calls=2_000,
                spawn_calls=10,
                mcp_calls=200,
                payload_calls={1024: 200, 65_536: 100, 1 << 20: 15},
                cold_runs=1,
                kills=1,
            )
        else:
            s = cls()
        if calls is not None:
            s.calls = calls
            s.warmup = max(100, calls // 10)
        return s


def echo_sidecar(
    tool: str, *, workers: int = 1, concurrency: int = 1, **more: Any
) -> dict[str, Any]:
    """A registry entry serving the SDK echo tool as ``tool``."""
    entry: dict[str, Any] = {
        "command": "python",
        "args": [str(ECHO)],
        "env": {"ECHO_TOOL": tool, "ECHO_CONCURRENCY": str(concurrency)},
        "tools": [tool],
        "pool": {"min": workers, "max": workers, "queue": 4096},
    }
    entry.update(more)
    return entry


SIDECAR_ENTRIES: dict[str, dict[str, Any]] = {
    # The payload scenario echoes up to 1 MB each way: this sidecar raises the 64 KiB default
    # output cap on purpose (to the former 4 MiB default) so the whole payload comes back.
    "echo": echo_sidecar("bench.echo", maxOutputBytes=4 * 1024 * 1024),
    "tp1": echo_sidecar("bench.echo.tp1", concurrency=THROUGHPUT_CONCURRENCY),
    "tp2": echo_sidecar("bench.echo.tp2", workers=2, concurrency=THROUGHPUT_CONCURRENCY),
    # The SDK default: workers of concurrency 1 (what most real sidecars are).
    "c1w1": echo_sidecar("bench.echo.c1w1"),
    "c1w2": echo_sidecar("bench.echo.c1w2", workers=2),
    "svc": {
        "command": "python",
        "args": [str(SIDECARS / "services_worker.py")],
        "tools": ["bench.services"],
        "state": [{"name": "bench"}],
        "timeoutMs": 600000,
    },
    "oneshot": {
        "command": "python",
        "args": [str(ECHO)],
        "env": {"ECHO_TOOL": "bench.echo.oneshot"},
        "protocol": "process-json",
        "mode": "oneshot",
        "tools": ["bench.echo.oneshot"],
        "pool": {"max": 4},
    },
    "simple": {
        "command": "python",
        "args": [str(SIDECARS / "echo_simple.py")],
        "protocol": "simple-json",
        "tools": ["bench.echo.simple"],
        "probe": {"timeoutMs": 5000},
    },
    "mcp": {
        "command": "python",
        "args": [str(SIDECARS / "echo_mcp.py")],
        "protocol": "mcp",
        "tools": ["bench_echo_mcp"],
        "probe": {"startTimeoutMs": 30000},
    },
    # Issue 29's gateway targets: five hosted SDK-written servers (``gw`` is measured, ``s5`` is
    # the one made to hang), next to the SDK echo ``echo`` above.
    **{
        name: {
            "command": "python",
            "args": [str(SIDECARS / "gateway_mcp.py")],
            "env": {"GW_NAME": name},
            "protocol": "mcp",
            "tools": [f"{name}_echo"],
            "probe": {"startTimeoutMs": 30000},
        }
        for name in ("gw", "s2", "s3", "s4", "s5")
    },
    "victim": echo_sidecar(
        "bench.echo.victim",
        restart={
            "backoffMs": RECOVERY_BACKOFF_MS,
            "resetAfterMs": 500,
            "intensity": 100,
            "periodMs": 60000,
        },
    ),
}

SCENARIO_SIDECARS: dict[str, list[str]] = {
    "floors": [],
    "e2e": ["echo"],
    "throughput": ["tp1", "tp2", "c1w1", "c1w2"],
    "foreign": ["echo", "oneshot", "simple", "mcp"],
    "payload": ["echo"],
    "cold_start": [],
    "recovery": ["victim"],
    "footprint": ["echo", "tp2"],
    "mcp_server": ["echo"],
    "mcp_gateway": ["echo", "gw", "s2", "s3", "s4", "s5"],
    "services": ["echo", "svc"],
    "compare": [],
    "confine": [],
}


def tool_of(sidecar: str) -> str:
    tools: list[str] = SIDECAR_ENTRIES[sidecar]["tools"]
    return tools[0]


class Bench:
    """Settings, results and the shared host of one run."""

    def __init__(self, settings: Settings, scenarios: list[str]) -> None:
        self.settings = settings
        self.scenarios = scenarios
        self.results = Results()
        self._host: BenchHost | None = None
        self.idle_rss: int | None = None
        self.profile: Path | None = None
        self._profiler: subprocess.Popen[bytes] | None = None

    def log(self, message: str) -> None:
        print(f"bench: {message}", file=sys.stderr, flush=True)

    def needed_sidecars(self) -> dict[str, dict[str, Any]]:
        names: list[str] = []
        for s in self.scenarios:
            names += [n for n in SCENARIO_SIDECARS[s] if n not in names]
        return {n: SIDECAR_ENTRIES[n] for n in names}

    @property
    def host(self) -> BenchHost:
        """The shared host, started (and its tools visible) on first use."""
        if self._host is None:
            sidecars = self.needed_sidecars()
            self.log(f"starting toolhost serve with {', '.join(sidecars)}")
            want_ws = "e2e" in self.scenarios
            host = BenchHost(sidecars, ws=want_ws)
            try:
                host.start()
            except RuntimeError as exc:
                if not want_ws:
                    raise
                # The gateway must not cost every other figure: note why, go on without it.
                lines = [ln.strip(" |+-") for ln in str(exc).splitlines()]
                why = [ln for ln in lines if ln and not ln.startswith("File ")][-1:]
                self.results.notes.append(
                    "websocket: toolhost serve failed to start with host.ws configured, so the "
                    "websocket row is missing: " + "".join(why)
                )
                self.log("toolhost serve failed with host.ws; starting it without the gateway")
                host = BenchHost(sidecars, ws=False)
                host.start()
            self._host = host
            host.wait_tools([tool_of(n) for n in sidecars])
            for n, entry in sidecars.items():
                persistent = entry.get("mode", "persistent") == "persistent"
                if persistent and entry.get("protocol") != "simple-json":
                    host.wait_workers(n, entry.get("pool", {}).get("min", 1))
            time.sleep(0.3)  # let start-up work (catalog events, first probes) settle
            self.idle_rss = rss_bytes(host.pid)
            self._start_profiler(host.pid)
        return self._host

    def _start_profiler(self, pid: int) -> None:
        if self.profile is None:
            return
        exe = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
        fmt = {".json": "speedscope", ".txt": "raw"}.get(self.profile.suffix, "flamegraph")
        self.log(f"profiling the host (pid {pid}) with py-spy into {self.profile}")
        try:
            self._profiler = subprocess.Popen(
                [
                    exe,
                    "record",
                    "--pid",
                    str(pid),
                    "--rate",
                    "250",
                    "--format",
                    fmt,
                    "--output",
                    str(self.profile),
                ],
                stdout=subprocess.DEVNULL,
            )
        except OSError as exc:
            self.log(f"cannot run py-spy ({exc}); pip install py-spy")

    def close(self) -> None:
        if self._profiler is not None:
            self._profiler.send_signal(signal.SIGINT)
            try:
                self._profiler.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self._profiler.kill()
        if self._host is not None:
            self._host.stop()
            self._host = None
