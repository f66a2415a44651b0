"""The toolhost sidecar SDK: a tool is a function taking a msgspec Struct.

Example::

    from msgspec import Struct
    from sidecars.sdk import Context, Sidecar

    app = Sidecar("demo", version="1.0.0")

    class EchoInput(Struct, forbid_unknown_fields=True):
        text: str

    @app.tool("demo.echo", description="Echo text back.", read_only=True)
    def echo(args: EchoInput, ctx: Context) -> dict:
        return {"text": args.text}

    if __name__ == "__main__":
        app.run()

Tools may also be ``async def`` (``await`` inside; ``ctx.nursery`` for state kept across
calls): a sidecar with any async tool is served by one Trio loop, and a host ``cancel`` is a
real ``trio.Cancelled`` in the tool (``docs/sidecars.md``, "Async tools").

The same program answers the persistent process-json protocol (PROTOCOL 3.1) and a single
Flyflor oneshot request (PROTOCOL 3.2).
"""

from sidecars.sdk.app import Sidecar
from sidecars.sdk.context import Context
from sidecars.sdk.services import Invocation, ServiceError, State
from sidecars.sdk.tools import Reply, ToolError, ToolSpec

__all__ = [
    "Context",
    "Invocation",
    "Reply",
    "ServiceError",
    "Sidecar",
    "State",
    "ToolError",
    "ToolSpec",
]
