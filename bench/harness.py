"""Measurement helpers: percentiles, floors, and a host started for the bench.

Every figure is taken next to its baseline in the same process run, so the ratios stay
meaningful on a shared, noisy machine.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ECHO = Path(__file__).resolve().parent / "sidecars" / "echo.py"


def percentiles(samples: list[float]) -> dict[str, float]:
    """p50, p90, p99 and max of ``samples`` (seconds) in microseconds."""
    s = sorted(samples)
    n = len(s)

    def at(q: float) -> float:
        return s[min(n - 1, int(q * n))] * 1e6

    return {"n": n, "p50": at(0.50), "p90": at(0.90), "p99": at(0.99), "max": s[-1] * 1e6}


def timed(fn: Callable[[], Any], calls: int, warmup: int) -> list[float]:
    for _ in range(warmup):
        fn()
    out = []
    clock = time.perf_counter
    for _ in range(calls):
        t0 = clock()
        fn()
        out.append(clock() - t0)
    return out


class LineClient:
    """A blocking newline-delimited JSON peer over any pair of file descriptors."""

    def __init__(self, rfile: Any, wfile: Any) -> None:
        self.rfile = rfile
        self.wfile = wfile

    def roundtrip(self, line: bytes) -> bytes:
        self.wfile.write(line)
        self.wfile.flush()
        answer: bytes = self.rfile.readline()
        return answer


@contextmanager
def direct_worker(env: dict[str, str] | None = None) -> Iterator[LineClient]:
    """The echo worker on plain pipes, after the init/ready handshake (the single-hop floor)."""
    proc = subprocess.Popen(
        [sys.executable, str(ECHO)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env={**os.environ, **(env or {})},
    )
    assert proc.stdin and proc.stdout
    init = {"type": "init", "sidecar": "bench", "projectDir": ".", "configDir": ".", "cwd": "."}
    proc.stdin.write(json.dumps(init).encode() + b"\n")
    proc.stdin.flush()
    proc.stdout.readline()
    try:
        yield LineClient(proc.stdout, proc.stdin)
    finally:
        proc.stdin.close()
        proc.wait(timeout=10)


@contextmanager
def served_host(sidecars: dict[str, Any]) -> Iterator[Path]:
    """``toolhost serve`` on a temporary app root; yields the socket path once tools are up."""
    with tempfile.TemporaryDirectory(prefix="toolhost-bench-") as tmp:
        root = Path(tmp)
        (root / "tools").mkdir()
        registry = {"schemaVersion": 2, "sidecars": sidecars}
        (root / "tools" / "external.tools.jsonc").write_text(json.dumps(registry))
        proc = subprocess.Popen(
            [sys.executable, "-m", "supervisor", "serve", "--app-root", str(root), "--no-global"],
            stderr=subprocess.PIPE,
        )
        assert proc.stderr
        for raw in proc.stderr:
            if b"toolhost serving" in raw:
                break
        sock = root / ".toolhost" / "host.sock"
        try:
            wait_tools_visible(sock, [t for s in sidecars.values() for t in s.get("tools", [])])
            yield sock
        finally:
            proc.terminate()
            proc.wait(timeout=30)


def unix_line_client(sock: Path) -> tuple[socket.socket, LineClient]:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(str(sock))
    return s, LineClient(s.makefile("rb"), s.makefile("wb"))


def wait_tools_visible(sock: Path, tools: list[str], timeout: float = 30) -> None:
    s, client = unix_line_client(sock)
    deadline = time.monotonic() + timeout
    req = json.dumps({"id": 1, "method": "tools.list", "params": {}}).encode() + b"\n"
    try:
        while time.monotonic() < deadline:
            names = {t["name"] for t in json.loads(client.roundtrip(req))["result"]["tools"]}
            if set(tools) <= names:
                return
            time.sleep(0.05)
        raise TimeoutError(f"tools {tools} never became visible")
    finally:
        s.close()
