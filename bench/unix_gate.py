"""Bench of the Unix socket gate (docs/confinement.md, "Unix sockets: the gate"): what one
``connect`` to a granted Unix socket costs a worker whose profile grants ``unix`` paths (every
connect is a round trip to the host, which makes it), against the same connect with
``host.confinement: off``, in one run (``python -m bench.unix_gate``; see bench/README.md).

Two hosts run side by side, one confined (the gate on), one not; rounds alternate between them
so drift on the shared machine hits both alike. Times are measured in the worker around
``connect`` alone.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import tempfile
import threading
from pathlib import Path

from bench.host import REPO, BenchHost


def _accept_forever(listener: socket.socket) -> None:
    while True:
        try:
            conn, _ = listener.accept()
        except OSError:
            return
        conn.close()


def _entry(folder: str) -> dict[str, object]:
    return {
        "command": "python",
        "args": [str(REPO / "bench" / "sidecars" / "unix_connect.py")],
        "tools": ["bench.unix_connect"],
        "confine": {"unix": [folder]},
    }


def run(rounds: int, n: int) -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix="th-gate-") as folder:
        path = os.path.join(folder, "s.sock")
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(path)
        listener.listen(256)
        threading.Thread(target=_accept_forever, args=(listener,), daemon=True).start()
        hosts = {
            "gated": BenchHost({"u": _entry(folder)}, host={"confinement": "best-effort"}),
            "off": BenchHost({"u": _entry(folder)}, host={"confinement": "off"}),
        }
        times: dict[str, list[float]] = {k: [] for k in hosts}
        try:
            for h in hosts.values():
                h.start()
                h.wait_tools(["bench.unix_connect"])
            for r in range(rounds):
                order = list(hosts) if r % 2 == 0 else list(reversed(hosts))
                for name in order:
                    res = hosts[name].control.request(
                        "tools.invoke",
                        {"tool": "bench.unix_connect", "input": {"path": path, "n": n}},
                    )
                    data = res.get("data") if isinstance(res, dict) else None
                    if not isinstance(data, dict):
                        raise RuntimeError(f"{name}: {res}")
                    times[name] += data["us"][5:] if r == 0 else data["us"]
        finally:
            for h in hosts.values():
                h.stop()
            listener.close()
    p50 = {k: statistics.median(v) for k, v in times.items()}
    return {
        "connects": {k: len(v) for k, v in times.items()},
        "p50Us": p50,
        "ratio": p50["gated"] / p50["off"],
        "extraUs": p50["gated"] - p50["off"],
        "load": os.getloadavg(),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("-n", type=int, default=200, help="connects per call")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    out = run(args.rounds, args.n)
    print(json.dumps(out, indent=2))
    if args.out:
        args.out.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
