"""The egress proxy's cost on the real path, fetch by fetch (issue 28):
``python -m bench.egress_host``.

Two ``toolhost serve`` hosts as ``bench.confine_paths`` makes them (the bundled web sidecar,
confined): ``proxy`` (``network.allow`` naming a loopback page: through the host's egress proxy)
and ``confined`` (``network: "host"``: every wall, no proxy). After warm-up, ``--fetches``
``web.fetch`` calls (``as: raw``, a 100 KB page) of each host in turn, one call each, so a load
swing hits both alike. Reported per turn: the host process's CPU per fetch (``schedstat`` run
time summed over its threads, read around each call) for each host and the difference (what
the proxy adds to the host), and the median fetch of each and their ratio (the proxy's own part
of the ``web.fetch`` row of ``--only confine``, measured call by call). Compare trees by
alternating runs in the same minutes.
"""

from __future__ import annotations

import argparse
import statistics
import time
from contextlib import ExitStack, closing

from bench.clients import LineClient, check_envelope, ndjson
from bench.confine_paths import PAGE_BYTES, page_server, web_entry
from bench.host import BenchHost
from bench.mcp_gateway_ab import cpu_ns


def measure(fetches: int, warmup: int = 20) -> dict[str, float]:
    """Host CPU per fetch (µs) and median fetch (ms) of the ``proxy`` and ``confined`` hosts."""
    with ExitStack() as stack:
        port = stack.enter_context(page_server())
        url = f"http://127.0.0.1:{port}/page"
        entry = web_entry(port)
        confined = {**entry, "confine": {"network": "host"}}
        host = {"confinement": "best-effort"}
        hosts = {
            "proxy": stack.enter_context(BenchHost({"web": entry}, host=host)),
            "confined": stack.enter_context(BenchHost({"web": confined}, host=host)),
        }
        req = ndjson(
            {
                "id": 1,
                "method": "tools.invoke",
                "params": {"tool": "web.fetch", "input": {"url": url, "as": "raw"}},
            }
        )
        clients: dict[str, LineClient] = {}
        for name, bench_host in hosts.items():
            bench_host.wait_tools(["web.fetch"])
            clients[name] = stack.enter_context(closing(LineClient(bench_host.connect())))
            for _ in range(warmup):
                env = check_envelope(clients[name].roundtrip(req))
                if f'"bytes":{PAGE_BYTES}' not in str(env.get("content", "")):
                    raise RuntimeError(f"web.fetch {name}: short answer {str(env)[:300]}")
        cpu = dict.fromkeys(hosts, 0)
        took: dict[str, list[float]] = {name: [] for name in hosts}
        for _ in range(fetches):
            for name, client in clients.items():
                proc = hosts[name].proc
                assert proc is not None
                c0, t0 = cpu_ns(proc.pid), time.perf_counter()
                check_envelope(client.roundtrip(req))
                took[name].append(time.perf_counter() - t0)
                cpu[name] += cpu_ns(proc.pid) - c0
    proxy, plain = (statistics.median(took[k]) * 1e3 for k in ("proxy", "confined"))
    return {
        "proxyHostUsPerFetch": cpu["proxy"] / fetches / 1e3,
        "confinedHostUsPerFetch": cpu["confined"] / fetches / 1e3,
        "proxyMs": proxy,
        "confinedMs": plain,
    }


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.egress_host", description=__doc__)
    parser.add_argument("--fetches", type=int, default=300)
    parser.add_argument("--runs", type=int, default=1)
    args = parser.parse_args()
    for run in range(args.runs):
        with open("/proc/loadavg") as f:
            load = " ".join(f.read().split()[:3])
        out = measure(args.fetches)
        p, c = out["proxyHostUsPerFetch"], out["confinedHostUsPerFetch"]
        print(
            f"run {run + 1} (load {load}): host CPU per fetch proxy {p:.0f} µs, confined "
            f"{c:.0f} µs, proxy - confined {p - c:.0f} µs; median fetch proxy "
            f"{out['proxyMs']:.2f} ms, confined {out['confinedMs']:.2f} ms, proxy / confined "
            f"{out['proxyMs'] / out['confinedMs']:.2f}x"
        )


if __name__ == "__main__":
    main()
