"""The bench's Unix connect loop, written with the toolhost SDK: ``bench.unix_connect``
connects to ``path`` ``n`` times (closing each) and returns each connect's time in µs, measured
in the worker, so the host's Unix socket gate is timed alone (``bench/unix_gate.py``)."""

import socket
import time

import msgspec

from sidecars.sdk import Context, Sidecar

app = Sidecar("bench-unix-connect", version="1.0.0")


class LoopInput(msgspec.Struct):
    path: str
    n: int = 100


@app.tool("bench.unix_connect", description="Connect to a Unix socket n times.", read_only=True)
def loop(args: LoopInput, ctx: Context) -> dict[str, list[float]]:
    times = []
    for _ in range(args.n):
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            t0 = time.perf_counter()
            s.connect(args.path)
            times.append((time.perf_counter() - t0) * 1e6)
    return {"us": times}


if __name__ == "__main__":
    app.run()
