"""Syscalls per call of toolhost and of the plain NDJSON relay, counted with ``strace -c``.

``python -m bench.syscalls [--calls N] [--window W]``: serves one concurrency-1 SDK echo worker
through ``toolhost serve`` and through ``bench/ndjson_relay.py``, drives each with the same
pipelined client (W calls in flight), and prints ``strace -c -f`` of the serving process over
N calls. Counts are exact and repeatable where timings on a shared machine are not.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from bench.clients import PipelinedClient, unix_connect
from bench.floors import ECHO


def _host(root: str) -> tuple[subprocess.Popen[bytes], str]:
    os.makedirs(os.path.join(root, "tools"))
    registry = {
        "schemaVersion": 2,
        "host": {"auditLog": ""},
        "sidecars": {
            "c1": {
                "command": "python",
                "args": [str(ECHO)],
                "env": {"ECHO_TOOL": "bench.echo", "ECHO_CONCURRENCY": "1"},
                "tools": ["bench.echo"],
                "pool": {"min": 1, "max": 1, "queue": 4096},
            }
        },
    }
    with open(os.path.join(root, "tools", "external.tools.jsonc"), "w") as f:
        json.dump(registry, f)
    proc = subprocess.Popen(
        [sys.executable, "-m", "supervisor", "serve", "--app-root", root, "--no-global"],
        stderr=subprocess.PIPE,
    )
    assert proc.stderr is not None
    for line in proc.stderr:
        if b"toolhost serving" in line:
            break
    time.sleep(1.0)  # the worker's first probe
    return proc, os.path.join(root, ".toolhost", "host.sock")


def _relay(root: str) -> tuple[subprocess.Popen[bytes], str]:
    path = os.path.join(root, "relay.sock")
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench.ndjson_relay", path, "1", "1"], stdout=subprocess.PIPE
    )
    assert proc.stdout is not None
    proc.stdout.readline()
    return proc, path


def count(kind: str, calls: int, window: int) -> str:
    """``strace -c`` of the serving process over ``calls`` calls."""
    root = tempfile.mkdtemp()
    proc, sock_path = _host(root) if kind == "toolhost" else _relay(root)
    out = os.path.join(root, "strace.txt")
    try:
        sock = unix_connect(sock_path)
        client = PipelinedClient(sock, "bench.echo", "x" * 64, window)
        client.run(500)
        tracer = subprocess.Popen(["strace", "-c", "-f", "-p", str(proc.pid), "-o", out])
        time.sleep(0.5)
        client.run(calls)
        tracer.send_signal(signal.SIGINT)
        tracer.wait()
        sock.close()
        with open(out) as f:
            return f.read()
    finally:
        proc.kill()
        proc.wait()
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--calls", type=int, default=3000)
    p.add_argument("--window", type=int, default=1)
    args = p.parse_args()
    if shutil.which("strace") is None:
        sys.exit("bench.syscalls needs strace (apt-get install strace)")
    for kind in ("ndjson relay", "toolhost"):
        print(f"== {kind}: {args.calls} calls, {args.window} in flight")
        print(count(kind, args.calls, args.window))


if __name__ == "__main__":
    main()
