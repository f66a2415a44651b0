"""Telemetry's cost on the call path (issue 21): host CPU per call at 64 in flight.

Four ``toolhost serve`` processes run side by side on the same registry (one echo sidecar, two
workers of concurrency 64), and are measured in turns, round after round, so drift on this
shared machine hits them alike:

- ``no extra``: ``host.telemetry.enabled: true`` but ``opentelemetry`` cannot be imported
  (blocked in that process): the build without the feature, as far as the call path can tell;
- ``off``: the extra installed, telemetry off (the default);
- ``on 100%``: on, every call sampled (``parentbased_always_on``), exported to a loopback
  collector that accepts and drops OTLP;
- ``on 1%``: on, ``parentbased_traceidratio`` at 0.01.

Host CPU per call is ``utime + stime`` of the host process over the timed window divided by the
calls. Ratios are against ``no extra`` (``off``) and ``off`` (the two ``on`` rows); each figure
is the median of the rounds. Run: ``python -m bench.telemetry [--calls N] [--rounds R]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from bench.clients import PipelinedClient, unix_connect
from bench.machine import REPO, CpuWindow
from bench.run import ECHO, PAYLOAD

TOOL = "bench.echo.otel"
WINDOW = 64

BLOCK_OTEL = """
import sys
class _NoOtel:
    def find_spec(self, name, path=None, target=None):
        if name == "opentelemetry" or name.startswith("opentelemetry."):
            raise ImportError(name + " is blocked: the build without the otel extra")
sys.meta_path.insert(0, _NoOtel())
from supervisor.cli.main import main
sys.exit(main(sys.argv[1:]))
"""


def _collector() -> tuple[ThreadingHTTPServer, int]:
    """A loopback OTLP/HTTP endpoint that reads and drops every export."""

    class Sink(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Sink)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, server.server_address[1]


class Host:
    """One ``toolhost serve`` with its own app root, registry and environment."""

    def __init__(self, name: str, telemetry: bool, env: dict[str, str], block: bool) -> None:
        self.name = name
        self._tmp = tempfile.TemporaryDirectory(prefix="toolhost-bench-otel-")
        self.root = Path(self._tmp.name)
        (self.root / "tools").mkdir()
        registry = {
            "schemaVersion": 2,
            "host": {"telemetry": {"enabled": telemetry}, "auditLog": ""},
            "sidecars": {
                "echo": {
                    "command": "python",
                    "args": [str(ECHO)],
                    "env": {"ECHO_TOOL": TOOL, "ECHO_CONCURRENCY": str(WINDOW)},
                    "tools": [TOOL],
                    "pool": {"min": 2, "max": 2, "queue": 4096},
                }
            },
        }
        (self.root / "tools" / "external.tools.jsonc").write_text(json.dumps(registry))
        args = ["serve", "--app-root", str(self.root), "--no-global"]
        argv = (
            [sys.executable, "-c", BLOCK_OTEL, *args]
            if block
            else [sys.executable, "-m", "supervisor", *args]
        )
        full_env = {**os.environ, "XDG_CONFIG_HOME": str(self.root / ".xdg"), **env}
        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env=full_env,
            cwd=str(REPO),
        )
        self.lines: list[str] = []
        self.serving = threading.Event()
        threading.Thread(target=self._drain, daemon=True).start()
        self.cpu_us: list[float] = []
        self.rates: list[float] = []

    def _drain(self) -> None:
        assert self.proc.stderr is not None
        for raw in self.proc.stderr:
            line = raw.decode(errors="replace")
            if len(self.lines) < 200:
                self.lines.append(line)
            if "toolhost serving" in line:
                self.serving.set()
        self.serving.set()

    def wait_ready(self) -> None:
        if not self.serving.wait(60) or self.proc.poll() is not None:
            raise RuntimeError(f"{self.name}: host did not start:\n" + "".join(self.lines))
        deadline = time.monotonic() + 60
        while True:  # until both workers answer
            try:
                self.measure(200, record=False)
                return
            except (OSError, RuntimeError):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def measure(self, calls: int, *, record: bool = True) -> None:
        sock = unix_connect(self.root / ".toolhost" / "host.sock")
        try:
            client = PipelinedClient(sock, TOOL, PAYLOAD, WINDOW)
            client.run(min(calls, 2000))  # warm-up
            cpu = CpuWindow(self.proc.pid).start()
            _lat, elapsed, bad = client.run(calls)
            cpu.stop()
        finally:
            sock.close()
        if bad:
            raise RuntimeError(f"{self.name}: {bad} calls did not succeed")
        if record:
            self.cpu_us.append(cpu.seconds / calls * 1e6)
            self.rates.append(calls / elapsed)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._tmp.cleanup()


def run(calls: int, rounds: int) -> dict[str, Any]:
    """Measure the four hosts in turns; returns the record (also printed as a table)."""
    server, port = _collector()
    otlp = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}",
        "OTEL_METRIC_EXPORT_INTERVAL": "5000",
    }
    plain: dict[str, str] = {}
    hosts = [
        Host("no extra", True, plain, block=True),
        Host("off", False, plain, block=False),
        Host("on 100%", True, {**otlp, "OTEL_TRACES_SAMPLER": "parentbased_always_on"}, False),
        Host(
            "on 1%",
            True,
            {
                **otlp,
                "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
                "OTEL_TRACES_SAMPLER_ARG": "0.01",
            },
            False,
        ),
    ]
    try:
        for h in hosts:
            h.wait_ready()
        for r in range(rounds):
            order = hosts if r % 2 == 0 else list(reversed(hosts))
            for h in order:
                h.measure(calls)
    finally:
        for h in hosts:
            h.stop()
        server.shutdown()
    med = {h.name: statistics.median(h.cpu_us) for h in hosts}
    rate = {h.name: statistics.median(h.rates) for h in hosts}
    ratios = {
        "off / no extra": med["off"] / med["no extra"],
        "on 100% / off": med["on 100%"] / med["off"],
        "on 1% / off": med["on 1%"] / med["off"],
    }
    record: dict[str, Any] = {
        "calls": calls,
        "rounds": rounds,
        "inFlight": WINDOW,
        "hostCpuUsPerCall": med,
        "callsPerSecond": rate,
        "samples": {h.name: h.cpu_us for h in hosts},
        "ratios": ratios,
    }
    print(f"{'host':<10} {'CPU us/call':>12} {'calls/s':>10}")
    for h in hosts:
        print(f"{h.name:<10} {med[h.name]:>12.1f} {rate[h.name]:>10,.0f}")
    for k, v in ratios.items():
        print(f"{k:<16} {v:.3f}x")
    return record


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.telemetry", description=__doc__)
    p.add_argument("--calls", type=int, default=20_000, help="calls per host per round")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--out", help="write the JSON record here")
    args = p.parse_args(argv)
    record = run(args.calls, args.rounds)
    if args.out:
        Path(args.out).write_text(json.dumps(record, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
