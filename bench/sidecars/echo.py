"""The bench's trivial echo tool, written with the toolhost SDK (persistent and oneshot)."""

import os

import msgspec

from sidecars.sdk import Context, Sidecar

app = Sidecar(
    "bench-echo", version="1.0.0", concurrency=int(os.environ.get("ECHO_CONCURRENCY", "1"))
)


class EchoInput(msgspec.Struct):
    payload: str = ""


@app.tool("bench.echo", description="Return the payload unchanged.", read_only=True)
def echo(args: EchoInput, ctx: Context) -> dict[str, str]:
    return {"payload": args.payload}


if __name__ == "__main__":
    app.run()
