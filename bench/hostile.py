"""Hostile clients against a real ``toolhost serve``: memory before, during and after (issue 12).

Experiments, one host process each, RSS read from ``/proc/<pid>/status``:

- ``connections``: open N idle connections (the host holds up to ``host.maxConnections``, the
  rest get one ``overloaded`` line), then close them all.
- ``oversized``: send one line of M bytes (over ``host.maxFrameBytes``, refused while reading),
  then garbage lines (each answered ``invalid-request``).

Each reports RSS idle (after warm-up calls), at the peak, and after the clients left (after a
few settle calls), and the difference after - idle: the target is within 10 MB.

    python -m bench.hostile                       # 20,000 connections, one 100 MB line
    python -m bench.hostile --connections 2000 --line-mb 20 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
ECHO = REPO / "tests" / "fixtures" / "sidecars" / "echo.py"
MIB = 1024 * 1024


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    return 0.0


class Host:
    """``toolhost serve`` in a temporary app root with one echo sidecar."""

    def __init__(self, max_connections: int, nofile: int) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="toolhost-hostile-"))
        (self.root / "tools").mkdir()
        registry = {
            "schemaVersion": 2,
            "host": {"maxConnections": max_connections, "auditLog": ""},
            "sidecars": {"echo": {"command": "python", "args": [str(ECHO)], "tools": ["echo.say"]}},
        }
        (self.root / "tools" / "external.tools.jsonc").write_text(json.dumps(registry))
        self.sock = str(self.root / ".toolhost" / "host.sock")
        env = {**os.environ, "XDG_CONFIG_HOME": str(self.root / ".xdg")}

        def limit() -> None:
            _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
            resource.setrlimit(resource.RLIMIT_NOFILE, (min(nofile, hard), hard))

        self.proc = subprocess.Popen(
            [sys.executable, "-m", "supervisor", "serve", "--app-root", str(self.root)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env=env,
            preexec_fn=limit,
        )
        assert self.proc.stderr is not None
        for raw in self.proc.stderr:
            if b"toolhost serving" in raw:
                break
        else:
            raise RuntimeError("toolhost serve did not start")
        # Keep draining stderr so the host never blocks on a full pipe.
        self.log = self.root.parent / (self.root.name + ".log")
        with open(self.log, "wb") as sink:
            self._drain = subprocess.Popen(["cat"], stdin=self.proc.stderr, stdout=sink)

    def call(self, text: str = "x", on: socket.socket | None = None) -> dict[str, Any]:
        """One echo call on a new connection (or on ``on``)."""
        if on is None:
            with self.connect() as s:
                return self.call(text, s)
        params = {"tool": "echo.say", "input": {"text": text}}
        req = {"id": 1, "method": "tools.invoke", "params": params}
        on.sendall(json.dumps(req).encode() + b"\n")
        return json.loads(_line(on))

    def connect(self) -> socket.socket:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(30)
        s.connect(self.sock)
        return s

    def warm(self, n: int = 50) -> None:
        deadline = time.monotonic() + 30
        while self.call()["result"]["status"] != "success":
            if time.monotonic() > deadline:
                raise RuntimeError("echo never became available")
            time.sleep(0.1)
        for _ in range(n):
            self.call()

    @property
    def rss(self) -> float:
        return rss_mb(self.proc.pid)

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._drain.wait(timeout=5)
        shutil.rmtree(self.root, ignore_errors=True)


def _line(s: socket.socket) -> bytes:
    buf = b""
    while not buf.endswith(b"\n"):
        chunk = s.recv(65536)
        if not chunk:
            raise EOFError(buf)
        buf += chunk
    return buf


def _settle(host: Host) -> float:
    """RSS after the host had a moment and a few calls to release what the clients left."""
    time.sleep(1.5)
    for _ in range(20):
        host.call()
    time.sleep(0.5)
    return host.rss


def connections(n: int, max_connections: int) -> dict[str, Any]:
    """N idle connections at once, then all closed."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    host = Host(max_connections, nofile=hard)
    try:
        host.warm()
        idle = host.rss
        bystander = host.connect()
        held: list[socket.socket] = []
        for _ in range(min(n, hard - 64)):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            while True:
                try:
                    s.connect(host.sock)
                    break
                except BlockingIOError:
                    time.sleep(0.005)
            held.append(s)
        time.sleep(1.0)
        refused = 0
        for s in held:
            s.setblocking(False)
            try:
                if b'"overloaded"' in s.recv(4096):
                    refused += 1
            except BlockingIOError:
                pass
        during = host.call(on=bystander)["result"]["status"]  # a bystander during the flood
        peak = host.rss
        for s in held:
            s.close()
        bystander.close()
        after = _settle(host)
        return {
            "opened": len(held),
            "held": len(held) - refused,
            "refusedOverloaded": refused,
            "bystanderDuringFlood": during,
            "rssIdleMb": round(idle, 1),
            "rssPeakMb": round(peak, 1),
            "rssAfterMb": round(after, 1),
            "afterMinusIdleMb": round(after - idle, 1),
        }
    finally:
        host.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def oversized(line_mb: int, garbage: int) -> dict[str, Any]:
    """One line of ``line_mb`` MB (refused while reading), then garbage lines."""
    host = Host(1024, nofile=4096)
    try:
        host.warm()
        idle = host.rss
        answer: dict[str, Any] = {}
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(60)
            s.connect(host.sock)
            chunk = b"a" * MIB
            sent = 0
            try:
                s.sendall(b'{"id": 1, "method": "tools.invoke", "params": "')
                for _ in range(line_mb):
                    s.sendall(chunk)
                    sent += 1
                s.sendall(b'"}\n')
            except (BrokenPipeError, ConnectionResetError):
                pass  # refused and closed before the whole line arrived
            try:
                answer = json.loads(_line(s))
            except (EOFError, OSError, ValueError):
                answer = {}
        peak = host.rss
        refused_garbage = 0
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(30)
            s.connect(host.sock)
            for _ in range(garbage):
                s.sendall(b"\x00\xff{{ not json\n")
                msg = json.loads(_line(s))
                if msg.get("error", {}).get("code") == "invalid-request":
                    refused_garbage += 1
        after = _settle(host)
        return {
            "lineMb": line_mb,
            "sentMbBeforeRefusal": sent,
            "oversizedAnswer": answer.get("error", {}).get("message", "(connection closed)"),
            "garbageLinesRefused": refused_garbage,
            "rssIdleMb": round(idle, 1),
            "rssPeakMb": round(peak, 1),
            "rssAfterMb": round(after, 1),
            "afterMinusIdleMb": round(after - idle, 1),
        }
    finally:
        host.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.hostile", description=__doc__)
    p.add_argument("--connections", type=int, default=20_000)
    p.add_argument("--max-connections", type=int, default=20_000)
    p.add_argument("--line-mb", type=int, default=100)
    p.add_argument("--garbage", type=int, default=1000)
    p.add_argument("--json", type=Path, help="also write the figures here")
    args = p.parse_args(argv)
    out = {
        "connections": connections(args.connections, args.max_connections),
        "oversized": oversized(args.line_mb, args.garbage),
    }
    text = json.dumps(out, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
