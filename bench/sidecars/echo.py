"""The bench's trivial echo tool, written with the toolhost SDK (persistent and oneshot).

``ECHO_TOOL`` names the tool (default ``bench.echo``), so one registry can serve the same tool
from several differently configured sidecars; ``ECHO_CONCURRENCY`` sets the advertised
concurrency (calls in flight per worker).
"""

import os

import msgspec

from sidecars.sdk import Context, Sidecar

app = Sidecar(
    "bench-echo", version="1.0.0", concurrency=int(os.environ.get("ECHO_CONCURRENCY", "1"))
)


class EchoInput(msgspec.Struct):
    payload: str = ""


@app.tool(
    os.environ.get("ECHO_TOOL", "bench.echo"),
    description="Return the payload unchanged.",
    read_only=True,
)
def echo(args: EchoInput, ctx: Context) -> dict[str, str]:
    return {"payload": args.payload}


if __name__ == "__main__":
    app.run()
