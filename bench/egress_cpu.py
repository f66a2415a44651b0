"""The egress proxy's own CPU per proxied fetch (issue 28): ``python -m bench.egress_cpu``.

One :class:`EgressProxy` in this process's trio thread, serving a listener like a sidecar's;
a client thread fetches a 100 KB page (``bench.confine_paths.page_server``, its own threads)
through it, ``CONNECT`` head and request in one write as the web sidecar sends them. What is
reported is the trio thread's CPU (``thread_time``, and user / system from ``getrusage``) per
fetch: the proxy's work alone, without the page server's, the client's or another process's
(it still grows with the machine's load: ~0.8-1.0 ms at load 7-8, ~1.0-1.6 ms at load 9-10 on
the project machine; compare two trees alternating, in the same minutes).
"""

from __future__ import annotations

import argparse
import resource
import socket
import time

import trio

from bench.confine_paths import PAGE_BYTES, page_server
from supervisor.host.egress import EgressProxy, client_for


def _client(port: int, web: int, fetches: int, sizes: list[int]) -> None:
    request = (
        b"CONNECT 127.0.0.1:%d HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n\r\n"
        b"GET /page HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n" % (web, web)
    )
    for _ in range(fetches):
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.sendall(request)
            got = 0
            while data := sock.recv(65536):
                got += len(data)
            sizes.append(got)


async def measure(fetches: int, warmup: int = 20) -> dict[str, float]:
    """µs of the proxy's thread per fetch (``cpu``, ``user``, ``system``) and ms of wall."""
    with page_server() as web:
        async with trio.open_nursery() as nursery:
            proxy = EgressProxy()
            await nursery.start(proxy.run)
            listener = socket.socket()
            listener.bind(("127.0.0.1", 0))
            listener.listen(64)
            port = listener.getsockname()[1]
            proxy.serve_listener(listener, client_for("bench", [f"127.0.0.1:{web}"]))
            sizes: list[int] = []
            await trio.to_thread.run_sync(_client, port, web, warmup, sizes)
            r0 = resource.getrusage(resource.RUSAGE_THREAD)
            c0, t0 = time.thread_time(), time.perf_counter()
            await trio.to_thread.run_sync(_client, port, web, fetches, sizes)
            c1, t1 = time.thread_time(), time.perf_counter()
            r1 = resource.getrusage(resource.RUSAGE_THREAD)
            nursery.cancel_scope.cancel()
    if min(sizes) <= PAGE_BYTES:
        raise RuntimeError(f"a fetch through the proxy came back short: {min(sizes)} bytes")
    return {
        "cpuUsPerFetch": (c1 - c0) / fetches * 1e6,
        "userUsPerFetch": (r1.ru_utime - r0.ru_utime) / fetches * 1e6,
        "systemUsPerFetch": (r1.ru_stime - r0.ru_stime) / fetches * 1e6,
        "wallMsPerFetch": (t1 - t0) / fetches * 1e3,
    }


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.egress_cpu", description=__doc__)
    parser.add_argument("--fetches", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    with open("/proc/loadavg") as f:
        print("load average:", " ".join(f.read().split()[:3]))
    for run in range(args.runs):
        out = trio.run(measure, args.fetches)
        print(
            f"run {run + 1}: proxy thread {out['cpuUsPerFetch']:.0f} µs/fetch "
            f"(user {out['userUsPerFetch']:.0f}, system {out['systemUsPerFetch']:.0f}), "
            f"{out['wallMsPerFetch']:.2f} ms/fetch wall"
        )


if __name__ == "__main__":
    main()
