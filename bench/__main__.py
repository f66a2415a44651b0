"""``python -m bench``: the quick latency comparison (the full harness is `toolhost bench`)."""

from __future__ import annotations

import argparse
import json
import sys

from bench.harness import ECHO, direct_worker, percentiles, served_host, timed, unix_line_client


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench")
    parser.add_argument("--calls", type=int, default=5000)
    parser.add_argument("--warmup", type=int, default=500)
    parser.add_argument("--payload", type=int, default=64, help="payload bytes per call")
    args = parser.parse_args(argv)
    payload = "x" * args.payload
    call_line = json.dumps(
        {"type": "call", "id": 0, "tool": "bench.echo", "input": {"payload": payload}}
    ).encode()
    results = {}
    with direct_worker() as w:
        counter = iter(range(1, 10**9))

        def direct() -> None:
            w.roundtrip(call_line.replace(b'"id":0', b'"id":%d' % next(counter)) + b"\n")

        results["direct pipe (floor)"] = percentiles(timed(direct, args.calls, args.warmup))
    sidecar = {"command": "python", "args": [str(ECHO)], "tools": ["bench.echo"]}
    with served_host({"echo": sidecar}) as sock:
        s, client = unix_line_client(sock)
        req = (
            json.dumps(
                {
                    "id": 1,
                    "method": "tools.invoke",
                    "params": {"tool": "bench.echo", "input": {"payload": payload}},
                }
            ).encode()
            + b"\n"
        )

        def invoke() -> None:
            client.roundtrip(req)

        results["toolhost invoke (unix, ndjson)"] = percentiles(
            timed(invoke, args.calls, args.warmup)
        )
        s.close()
    floor = results["direct pipe (floor)"]["p50"]
    print(f"{'scenario':34} {'p50 us':>9} {'p90 us':>9} {'p99 us':>9} {'x floor':>8}")
    for name, r in results.items():
        print(f"{name:34} {r['p50']:9.1f} {r['p90']:9.1f} {r['p99']:9.1f} {r['p50'] / floor:8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
