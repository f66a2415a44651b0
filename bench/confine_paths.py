"""Confinement on the real paths (issue 28's targets): ``toolhost serve`` hosts, each on its own
temporary app root with the bundled manifests, confined (``host.confinement: best-effort``) and
not, measured alternating in one run.

- spawn -> ready: ``startMs`` (the start request -> the worker's first line, its handshake) of
  the bundled utility sidecar (``python -m sidecars.utility``, a real SDK worker), killed and
  restarted again and again: forked by the zygote (``spawn: auto``), exec'd (``spawn: exec``;
  confined, the zygote forks, walls and execs it), and confined through the exec shim (the
  zygote off: ``TOOLHOST_SPAWN=exec``'s path);
- host CPU per call: ``utime + stime`` of the host process over a window of calls of the SDK
  echo tool over the kernel socket, divided by the calls;
- ``web.fetch`` of a 100 KB loopback page (``as: raw``) by the bundled web sidecar, through the
  egress proxy (confined, ``network.allow`` naming the page's address), confined but on the
  host's network (``network: "host"``: the walls without the proxy) and directly (not
  confined; ``config.allowPrivate`` opens loopback to its own check either way).
"""

from __future__ import annotations

import http.server
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

from bench.clients import LineClient, check_envelope, invoke_request, ndjson
from bench.floors import ECHO
from bench.host import BenchHost
from bench.machine import CpuWindow

Log = Callable[[str], None]
PAGE_BYTES = 100 * 1024
UTILITY = ["file.hash", "archive.create", "archive.extract", "data.convert"]

SPAWNS = {
    # name: (spawn, zygote settings, confinement)
    "zygote": ("auto", {"replyTimeoutMs": 1000}, "off"),
    "zygote+walls": ("auto", {"replyTimeoutMs": 1000}, "best-effort"),
    "exec": ("exec", {"replyTimeoutMs": 1000}, "off"),
    "exec+walls": ("exec", {"replyTimeoutMs": 1000}, "best-effort"),
    "shim": ("auto", {"enabled": False}, "best-effort"),
}
"""Spawn -> ready configurations; ``shim`` is a confined start with no zygote to take it."""
PAIRS = [("zygote+walls", "zygote"), ("exec+walls", "exec"), ("shim", "exec")]


def _utility(spawn: str) -> dict[str, Any]:
    return {
        "utility": {
            "command": "python",
            "args": ["-m", "sidecars.utility"],
            "tools": UTILITY,
            "spawn": spawn,
            "restart": {"backoffMs": 0, "intensity": 100000},
            "probe": {"intervalMs": 0},
        }
    }


def _ready_worker(host: BenchHost, sidecar: str, not_pid: int, timeout_s: float = 60) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        for w in host.sidecar(sidecar).get("workers", []):
            if w["state"] == "ready" and w["pid"] != not_pid and w.get("startMs") is not None:
                return w
        if time.monotonic() > deadline:
            raise TimeoutError(f"{sidecar}: no new ready worker\n" + "".join(host.stderr_tail))
        time.sleep(0.005)


def spawn_to_ready(rounds: int, starts: int, log: Log) -> dict[str, list[float]]:
    """``startMs`` samples (seconds) per configuration, ``starts`` per configuration per round,
    one start of each configuration in turn (a load swing hits all alike; in blocks of
    ``starts`` per configuration the shim / exec ratio read 0.86-1.37x across four runs of one
    tree)."""
    out: dict[str, list[float]] = {k: [] for k in SPAWNS}
    by: dict[str, set[str]] = {k: set() for k in SPAWNS}
    with ExitStack() as stack:
        hosts = {}
        for name, (spawn, zygote, confinement) in SPAWNS.items():
            host = BenchHost(_utility(spawn), host={"confinement": confinement, "zygote": zygote})
            hosts[name] = stack.enter_context(host)
            hosts[name].wait_tools(UTILITY)
        for r in range(rounds):
            log(f"confine: spawn -> ready, round {r + 1}/{rounds}")
            for _ in range(starts):
                for name, host in hosts.items():
                    w = _ready_worker(host, "utility", 0)
                    os.kill(w["pid"], signal.SIGKILL)
                    new = _ready_worker(host, "utility", w["pid"])
                    out[name].append(new["startMs"] / 1000.0)
                    by[name].add(new["startedBy"])
    expected = {"zygote": {"zygote"}, "zygote+walls": {"zygote"}}
    for name, seen in by.items():
        if seen != expected.get(name, {"exec"}):
            raise RuntimeError(f"spawn -> ready {name}: workers started by {sorted(seen)}")
    return out


def host_cpu(rounds: int, calls: int, log: Log) -> dict[str, list[float]]:
    """Host CPU µs per call of the echo tool, per round, confined and not (two hosts)."""
    entry = {
        "echo": {
            "command": "python",
            "args": [str(ECHO)],
            "env": {"ECHO_TOOL": "bench.echo"},
            "tools": ["bench.echo"],
        }
    }
    out: dict[str, list[float]] = {"walls": [], "off": []}
    req = ndjson(invoke_request("bench.echo", "x" * 64))
    with ExitStack() as stack:
        hosts = {
            k: stack.enter_context(BenchHost(entry, host={"confinement": mode}))
            for k, mode in (("walls", "best-effort"), ("off", "off"))
        }
        clients = {}
        for k, host in hosts.items():
            host.wait_tools(["bench.echo"])
            clients[k] = LineClient(host.connect())
            for _ in range(max(100, calls // 10)):
                check_envelope(clients[k].roundtrip(req))
        for r in range(rounds):
            log(f"confine: host CPU per call, round {r + 1}/{rounds}")
            for k, host in hosts.items():
                c = clients[k]
                cpu = CpuWindow(host.pid).start()
                for _ in range(calls):
                    c.roundtrip(req)
                cpu.stop()
                out[k].append(cpu.per_call_us(calls)["hostCpuUsPerCall"])
        for c in clients.values():
            c.close()
    return out


class _Page(http.server.BaseHTTPRequestHandler):
    body = (b"0123456789abcdef" * (PAGE_BYTES // 16 + 1))[:PAGE_BYTES]

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args: object) -> None:
        pass


@contextmanager
def page_server() -> Iterator[int]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Page)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield int(server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()


FETCHES = [
    ("proxy", "best-effort", None),
    ("confined", "best-effort", "host"),
    ("direct", "off", None),
]
"""``web.fetch`` configurations: (name, ``host.confinement``, ``confine.network`` when not the
page's ``allow`` grant). ``confined`` has every wall but reaches the page on the host's network
(``network: "host"``): proxy / confined is the proxy's own cost, confined / direct the walls'."""


def web_entry(port: int) -> dict[str, Any]:
    """The web sidecar's registry entry for fetching the loopback page on ``port`` through the
    egress proxy (``confine.network.allow`` names it)."""
    return {
        "command": "python",
        "args": ["-m", "sidecars.web"],
        "tools": ["web.fetch"],
        "config": {"allowPrivate": True},
        "confine": {"network": {"allow": [f"127.0.0.1:{port}"]}},
    }


def web_fetch(rounds: int, calls: int, log: Log) -> dict[str, list[float]]:
    """Latencies (s) of ``web.fetch`` of a 100 KB loopback page, through the proxy (confined),
    confined on the host's network, and directly, ``calls`` per host per round, one call of
    each in turn."""
    out: dict[str, list[float]] = {k: [] for k, _, _ in FETCHES}
    with ExitStack() as stack:
        port = stack.enter_context(page_server())
        url = f"http://127.0.0.1:{port}/page"
        entry = web_entry(port)
        hosts = {
            k: stack.enter_context(
                BenchHost(
                    {"web": {**entry, "confine": {"network": net}}} if net else {"web": entry},
                    host={"confinement": mode},
                )
            )
            for k, mode, net in FETCHES
        }
        req = ndjson(
            {
                "id": 1,
                "method": "tools.invoke",
                "params": {"tool": "web.fetch", "input": {"url": url, "as": "raw"}},
            }
        )
        clients = {}
        for k, host in hosts.items():
            host.wait_tools(["web.fetch"])
            clients[k] = LineClient(host.connect())
            for _ in range(5):
                env = check_envelope(clients[k].roundtrip(req))
                if f'"bytes":{PAGE_BYTES}' not in str(env.get("content", "")):
                    raise RuntimeError(f"web.fetch {k}: short answer {str(env)[:300]}")
        for r in range(rounds):
            log(f"confine: web.fetch, round {r + 1}/{rounds}")
            for _ in range(calls):  # one call each in turn: a load swing hits all alike
                for k, c in clients.items():
                    t = time.perf_counter()
                    check_envelope(c.roundtrip(req))
                    out[k].append(time.perf_counter() - t)
        for c in clients.values():
            c.close()
    return out
