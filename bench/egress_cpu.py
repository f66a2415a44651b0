"""The egress proxy's own CPU per proxied fetch (issue 28): ``python -m bench.egress_cpu``.

One :class:`EgressProxy` in this process, serving a listener like a sidecar's; a client fetches
a 100 KB page (``bench.confine_paths.page_server``) through it, ``CONNECT`` head and request in
one write as the web sidecar sends them. Two ways to place the client and the page server:

- ``--peer process`` (the default): both in a child process, as in the host (the worker and the
  page are other processes). Reported: this process's CPU per fetch (``getrusage``, every
  thread: the proxy's trio thread and its relay thread), and the split between the two
  threads.
- ``--peer thread`` (session 5's figure): both as threads of this process. Reported: the trio
  thread's CPU (``thread_time``, user / system from ``getrusage``) and the relay thread's
  (``/proc/self/task/<tid>/schedstat``); their threads share this interpreter's lock with the
  proxy's, which a relay thread in the host does not have to.

A tree without the relay thread (or ``--no-relay``: the tunnel in trio tasks, as before it)
reports 0 for it. The figures grow with the machine's load
(~0.8-1.0 ms at load 7-8, ~1.0-1.6 ms at load 9-10 on the project machine for the trio thread
of session 5's tree): compare two trees alternating, in the same minutes.
"""

from __future__ import annotations

import argparse
import resource
import socket
import statistics
import subprocess
import sys
import time
from typing import Any

import trio

from bench.confine_paths import PAGE_BYTES, page_server
from supervisor.host.egress import EgressProxy, client_for


def _client(port: int, web: int, fetches: int, sizes: list[int], times: list[float]) -> None:
    request = (
        b"CONNECT 127.0.0.1:%d HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n\r\n"
        b"GET /page HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n" % (web, web)
    )
    for _ in range(fetches):
        began = time.perf_counter()
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.sendall(request)
            got = 0
            while data := sock.recv(65536):
                got += len(data)
            sizes.append(got)
        times.append(time.perf_counter() - began)


def _peer() -> None:
    """The child of ``--peer process``: a page server; each line ``<proxy port> <fetches>`` on
    stdin runs that many fetches and answers the smallest size and the median time of one."""
    with page_server() as web:
        print(web, flush=True)
        for line in sys.stdin:
            port, fetches = (int(x) for x in line.split())
            sizes: list[int] = []
            times: list[float] = []
            _client(port, web, fetches, sizes, times)
            print(min(sizes), statistics.median(times), flush=True)


def _thread_ns(tid: int) -> int:
    """CPU time (ns) of the thread ``tid`` of this process so far (0: none)."""
    if not tid:
        return 0
    with open(f"/proc/self/task/{tid}/schedstat") as f:
        return int(f.read().split()[0])


class _Peer:
    def __init__(self, peer: str) -> None:
        self.proc: subprocess.Popen[str] | None = None
        if peer == "process":
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "bench.egress_cpu", "--as-peer"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            assert self.proc.stdout is not None
            self.web = int(self.proc.stdout.readline())
        else:
            self._server = page_server()
            self.web = self._server.__enter__()

    def fetch(self, port: int, fetches: int) -> tuple[int, float]:
        """Run the fetches (blocking: called in a thread); the smallest size and the median
        time of one fetch (s, the client's: connect to the last byte)."""
        if self.proc is None:
            sizes: list[int] = []
            times: list[float] = []
            _client(port, self.web, fetches, sizes, times)
            return min(sizes), statistics.median(times)
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(f"{port} {fetches}\n")
        self.proc.stdin.flush()
        size, median = self.proc.stdout.readline().split()
        return int(size), float(median)

    def close(self) -> None:
        if self.proc is None:
            self._server.__exit__(None, None, None)
            return
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait()


async def measure(
    fetches: int, warmup: int = 20, peer: str = "process", relay: bool = True, fast: bool = True
) -> dict[str, float]:
    """µs of the proxy's trio thread per fetch (``cpu``, ``user``, ``system``), of its relay
    thread (``relay``) and of the process (``total``; with ``peer="thread"``: trio + relay), and
    ms of wall."""
    side = _Peer(peer)
    try:
        async with trio.open_nursery() as nursery:
            kw: dict[str, Any] = {} if fast else {"fast": False}  # none before the fast path
            proxy = EgressProxy(**kw) if relay else EgressProxy(relay=False)
            await nursery.start(proxy.run)
            listener = socket.socket()
            listener.bind(("127.0.0.1", 0))
            listener.listen(64)
            port = listener.getsockname()[1]
            proxy.serve_listener(listener, client_for("bench", [f"127.0.0.1:{side.web}"]))
            await trio.to_thread.run_sync(side.fetch, port, warmup)
            tid = getattr(proxy, "relay_thread_id", 0)
            r0 = resource.getrusage(resource.RUSAGE_THREAD)
            p0 = resource.getrusage(resource.RUSAGE_SELF)
            c0, t0, n0 = time.thread_time(), time.perf_counter(), _thread_ns(tid)
            fast0 = getattr(proxy, "served_fast", 0)
            smallest, median = await trio.to_thread.run_sync(side.fetch, port, fetches)
            served_fast = getattr(proxy, "served_fast", 0) - fast0
            c1, t1, n1 = time.thread_time(), time.perf_counter(), _thread_ns(tid)
            p1 = resource.getrusage(resource.RUSAGE_SELF)
            r1 = resource.getrusage(resource.RUSAGE_THREAD)
            nursery.cancel_scope.cancel()
    finally:
        side.close()
    if smallest <= PAGE_BYTES:
        raise RuntimeError(f"a fetch through the proxy came back short: {smallest} bytes")
    cpu = (c1 - c0) / fetches * 1e6
    relay_us = (n1 - n0) / fetches / 1e3
    process = (p1.ru_utime + p1.ru_stime - p0.ru_utime - p0.ru_stime) / fetches * 1e6
    return {
        "totalUsPerFetch": process if peer == "process" else cpu + relay_us,
        "relayUsPerFetch": relay_us,
        "cpuUsPerFetch": cpu,
        "userUsPerFetch": (r1.ru_utime - r0.ru_utime) / fetches * 1e6,
        "systemUsPerFetch": (r1.ru_stime - r0.ru_stime) / fetches * 1e6,
        "wallMsPerFetch": (t1 - t0) / fetches * 1e3,
        "medianMsPerFetch": median * 1e3,
        "fastShare": served_fast / fetches,
    }


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.egress_cpu", description=__doc__)
    parser.add_argument("--fetches", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--peer", choices=["process", "thread"], default="process")
    parser.add_argument(
        "--no-relay", action="store_true", help="tunnels in trio tasks (no relay thread)"
    )
    parser.add_argument(
        "--no-fast",
        action="store_true",
        help="accept, head, check and connect in the trio thread (no fast path in the relay)",
    )
    parser.add_argument("--as-peer", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.as_peer:
        _peer()
        return
    with open("/proc/loadavg") as f:
        print("load average:", " ".join(f.read().split()[:3]))
    for run in range(args.runs):
        out = trio.run(measure, args.fetches, 20, args.peer, not args.no_relay, not args.no_fast)
        what = "process" if args.peer == "process" else "trio + relay"
        print(
            f"run {run + 1} (peer {args.peer}): {what} {out['totalUsPerFetch']:.0f} µs/fetch; "
            f"trio thread {out['cpuUsPerFetch']:.0f} (user {out['userUsPerFetch']:.0f}, "
            f"system {out['systemUsPerFetch']:.0f}), relay thread {out['relayUsPerFetch']:.0f}; "
            f"{out['wallMsPerFetch']:.2f} ms/fetch wall, median {out['medianMsPerFetch']:.2f} ms; "
            f"{out['fastShare']:.0%} served whole in the relay thread"
        )


if __name__ == "__main__":
    main()
