"""What a web console costs the host: host CPU per call under 64 calls in flight, with one
console-like WebSocket client subscribed to everything (``events.subscribe`` workers, calls,
logs; ``capability.catalog.subscribe``; ``system.stats`` and ``system.health`` every 2 s, as the
page does) against the same load without it, in the same run, rounds alternated.

    python -m bench.console [--calls 20000] [--rounds 3] [--out bench/results/console.json]

The target (issue 22): the ratio is at most 1.05. Run it on a quiet machine; the ratio is the
median of the per-round ratios, each round measuring both sides back to back.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from bench.clients import PipelinedClient, WsClient
from bench.host import BenchHost
from bench.machine import CpuWindow
from bench.run import PAYLOAD, SIDECAR_ENTRIES, tool_of

WINDOW = 64
TARGET = 1.05


class Console:
    """A console that reads everything the host sends it, in a thread of its own."""

    def __init__(self, port: int, token: str) -> None:
        self.ws = WsClient("127.0.0.1", port, token)
        self.events = 0
        self.dropped = 0
        self._stop = threading.Event()
        for rid, (method, params) in enumerate(
            (
                ("server.hello", {"client": {"name": "bench-console"}}),
                ("capability.catalog.subscribe", {}),
                ("events.subscribe", {"topics": ["workers", "calls", "logs"]}),
            ),
            start=1,
        ):
            self.ws.sock.sendall(
                self.ws.frame(json.dumps({"id": rid, "method": method, "params": params}).encode())
            )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._poller = threading.Thread(target=self._poll, daemon=True)
        self._reader.start()
        self._poller.start()

    def _read(self) -> None:
        try:
            while not self._stop.is_set():
                msg = self.ws.receive()
                if msg.startswith(b'{"event":'):
                    self.events += 1
                    if msg.startswith(b'{"event":"events.dropped"'):
                        self.dropped += json.loads(msg)["data"]["count"]
        except (ConnectionError, OSError, ValueError):
            pass

    def _poll(self) -> None:
        rid = 100
        while not self._stop.wait(2.0):
            for method in ("system.stats", "system.health"):
                rid += 1
                frame = json.dumps({"id": rid, "method": method, "params": {}}).encode()
                try:
                    self.ws.sock.sendall(self.ws.frame(frame))
                except OSError:
                    return

    def close(self) -> None:
        self._stop.set()
        self.ws.close()


class ConsoleProcess:
    """A :class:`Console` in a process of its own (the load's client keeps its own core and GIL;
    a reader in the same process would slow the load and so change the host's batching)."""

    def __init__(self, port: int, token: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bench.console", "--follow", str(port)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(token + "\n")
        self.proc.stdin.flush()
        assert self.proc.stdout.readline().strip() == "subscribed"

    def count(self) -> tuple[int, int]:
        """Events and dropped events read so far."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write("count\n")
        self.proc.stdin.flush()
        events, dropped = self.proc.stdout.readline().split()
        return int(events), int(dropped)

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(10)


def follow(port: int) -> int:
    """``--follow``: be the console until stdin closes; ``count`` prints events and drops."""
    token = sys.stdin.readline().strip()
    console = Console(port, token)
    time.sleep(0.3)
    print("subscribed", flush=True)
    for line in sys.stdin:
        if line.strip() == "count":
            time.sleep(0.5)  # let the reader catch up with what is in flight
            print(console.events, console.dropped, flush=True)
    console.close()
    return 0


def measure(host: BenchHost, tool: str, calls: int) -> float:
    """Host CPU µs per call for ``calls`` calls with 64 in flight."""
    sock = host.connect()
    try:
        client = PipelinedClient(sock, tool, PAYLOAD, WINDOW)
        client.run(max(WINDOW * 4, calls // 10))  # warm-up
        cpu = CpuWindow(host.pid).start()
        _lat, _elapsed, bad = client.run(calls)
        cpu.stop()
    finally:
        sock.close()
    if bad:
        raise RuntimeError(f"{bad} calls failed")
    return cpu.seconds / calls * 1e6


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=20000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--follow", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.follow is not None:
        return follow(args.follow)
    tool = tool_of("tp2")
    rows: list[dict[str, Any]] = []
    with BenchHost({"tp2": SIDECAR_ENTRIES["tp2"]}, ws=True) as host:
        host.wait_workers("tp2", 2)
        assert host.ws_port is not None
        for r in range(args.rounds):
            without = measure(host, tool, args.calls)
            console = ConsoleProcess(host.ws_port, host.ws_token())
            try:
                events0, _ = console.count()
                with_console = measure(host, tool, args.calls)
                events, dropped = console.count()
                events -= events0
            finally:
                console.close()
            rows.append(
                {
                    "round": r + 1,
                    "withoutUsPerCall": round(without, 2),
                    "withConsoleUsPerCall": round(with_console, 2),
                    "ratio": round(with_console / without, 3),
                    "consoleEvents": events,
                    "consoleDropped": dropped,
                }
            )
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    ratio = statistics.median(row["ratio"] for row in rows)
    record = {
        "schema": "toolhost-bench-console/1",
        "calls": args.calls,
        "inFlight": WINDOW,
        "rounds": rows,
        "ratio": ratio,
        "target": TARGET,
        "met": ratio <= TARGET,
    }
    print(json.dumps(record, indent=2))
    if args.out is not None:
        args.out.write_text(json.dumps(record, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
