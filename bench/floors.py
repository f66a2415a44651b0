"""The floors: what the pipes themselves allow, measured with plain Python and no host.

- the **direct pipe** round trip: a plain process writing a ``call`` line to the echo worker's
  stdin and reading the ``result`` line from its stdout (one hop);
- the **two-hop floor**: a plain client -> Unix socket -> :mod:`bench.relay` (a selectors relay,
  no trio) -> pipe -> worker; the shape of toolhost's own path with nothing else in it;
- the **pipelined single-hop floor**: one thread writes call lines to the worker while another
  reads the results back, as fast as the worker and the pipe go (the throughput ceiling);
- the **raw OS pipe** bandwidth, for context next to the payload figures.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench.clients import LineClient, ndjson, unix_connect

SIDECARS = Path(__file__).resolve().parent / "sidecars"
ECHO = SIDECARS / "echo.py"
INIT = {
    "type": "init",
    "protocol": 1,
    "sidecar": "bench",
    "config": {},
    "projectDir": ".",
    "configDir": ".",
    "cwd": ".",
}


def call_line(payload: str, call_id: int = 1, tool: str = "bench.echo") -> bytes:
    """A persistent process-json ``call`` line for the echo tool."""
    return ndjson(
        {
            "type": "call",
            "id": call_id,
            "tool": tool,
            "input": {"payload": payload},
            "deadlineMs": 30000,
        }
    )


def echo_env(concurrency: int = 1, tool: str = "bench.echo") -> dict[str, str]:
    return {**os.environ, "ECHO_CONCURRENCY": str(concurrency), "ECHO_TOOL": tool}


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


class PipeWorker:
    """The echo worker on plain pipes, after the init/ready handshake.

    ``start_s`` is how long spawn -> ``ready`` took (the worker's own start-up cost).
    """

    def __init__(self, concurrency: int = 1) -> None:
        t0 = time.perf_counter()
        self.proc = subprocess.Popen(
            [sys.executable, str(ECHO)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=echo_env(concurrency),
        )
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.wfd = self.proc.stdin.fileno()
        self.rfile = self.proc.stdout
        write_all(self.wfd, ndjson(INIT))
        if b'"ready"' not in self.rfile.readline():
            raise RuntimeError("echo worker did not send ready")
        self.start_s = time.perf_counter() - t0

    def roundtrip(self, line: bytes) -> bytes:
        write_all(self.wfd, line)
        return self.rfile.readline()

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=10)
        self.rfile.close()


@contextmanager
def direct_worker(concurrency: int = 1) -> Iterator[PipeWorker]:
    w = PipeWorker(concurrency)
    try:
        yield w
    finally:
        w.close()


@contextmanager
def relayed_worker(concurrency: int = 1) -> Iterator[LineClient]:
    """A client connected through :mod:`bench.relay` to an echo worker, after init/ready."""
    with tempfile.TemporaryDirectory(prefix="toolhost-relay-") as tmp:
        path = os.path.join(tmp, "relay.sock")
        relay = subprocess.Popen(
            [sys.executable, "-m", "bench.relay", path, sys.executable, str(ECHO)],
            stdout=subprocess.PIPE,
            env=echo_env(concurrency),
            cwd=str(Path(__file__).resolve().parent.parent),
        )
        assert relay.stdout is not None
        try:
            if relay.stdout.readline().strip() != b"listening":
                raise RuntimeError("the relay did not start")
            client = LineClient(unix_connect(path))
            if b'"ready"' not in client.roundtrip(ndjson(INIT)):
                raise RuntimeError("echo worker behind the relay did not send ready")
            try:
                yield client
            finally:
                client.close()
            relay.wait(timeout=10)
        finally:
            if relay.poll() is None:
                relay.kill()
                relay.wait()
            relay.stdout.close()


def pipelined(calls: int, payload: str = "x" * 64, concurrency: int = 1) -> dict[str, Any]:
    """The pipelined single-hop floor: calls/s with one writer thread and one reader.

    The writer sends ``calls`` call lines (in batches of 64, as fast as the pipe takes them)
    while the reader reads the results back; the worker always has work waiting.
    """
    with direct_worker(concurrency) as w:
        # Ids must be unique while in flight: one pre-encoded line per call, written in batches.
        lines = [call_line(payload, i) for i in range(calls + 64)]
        # Warm up the worker's thread pool and the pipe.
        write_all(w.wfd, b"".join(lines[calls:]))
        for _ in range(64):
            w.rfile.readline()
        batches = [b"".join(lines[i : min(i + 64, calls)]) for i in range(0, calls, 64)]

        def writer() -> None:
            for batch in batches:
                write_all(w.wfd, batch)

        t0 = time.perf_counter()
        thread = threading.Thread(target=writer, daemon=True)
        thread.start()
        readline = w.rfile.readline
        bad = 0
        for _ in range(calls):
            if b'"ok":true' not in readline():
                bad += 1
        elapsed = time.perf_counter() - t0
        thread.join()
    return {"calls": calls, "elapsedS": elapsed, "rate": calls / elapsed, "failed": bad}


def raw_pipe_mbps(size: int, repeat: int) -> float:
    """Bandwidth of a bare OS pipe (MB/s): a thread writes ``repeat`` blocks of ``size``."""
    r, w = os.pipe()
    block = b"x" * size

    def writer() -> None:
        for _ in range(repeat):
            write_all(w, block)

    t0 = time.perf_counter()
    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    left = size * repeat
    while left:
        left -= len(os.read(r, 1 << 20))
    elapsed = time.perf_counter() - t0
    thread.join()
    os.close(r)
    os.close(w)
    return size * repeat / elapsed / 1e6
