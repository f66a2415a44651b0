"""The SDK echo of ``bench/sidecars/echo.py`` taking time per call, for ``bench/mcp_cold.py``.

``ECHO_TOOL`` names the tool; ``ECHO_SLEEP_MS`` sleeps that long in each call (the worker
idles, like a server waiting on something), ``ECHO_SPIN_MS`` keeps the CPU busy that long (like
a server doing work). The answer is the echo's.
"""

import os
import time

import msgspec

from sidecars.sdk import Context, Sidecar

SLEEP_S = float(os.environ.get("ECHO_SLEEP_MS", "0")) / 1000.0
SPIN_S = float(os.environ.get("ECHO_SPIN_MS", "0")) / 1000.0

app = Sidecar("bench-echo-idle", version="1.0.0")


class EchoInput(msgspec.Struct):
    payload: str = ""


@app.tool(os.environ.get("ECHO_TOOL", "bench.echo.idle"), description="Echo, slowly.")
def echo(args: EchoInput, ctx: Context) -> dict[str, str]:
    if SPIN_S:
        end = time.perf_counter() + SPIN_S
        while time.perf_counter() < end:
            _ = [str(i) for i in range(200)]  # touch memory, as real work would
    if SLEEP_S:
        time.sleep(SLEEP_S)
    return {"payload": args.payload}


if __name__ == "__main__":
    app.run()
