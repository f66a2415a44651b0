"""The stdio MCP sessions ``toolhost serve`` adopts from ``toolhost mcp`` (``mcp.adopt``).

# Strategy: ``toolhost mcp`` hands its stdin and stdout to the host (``server/adopt.py`` carries
# them); the host serves the session in its own process exactly as ``--embedded`` does: the
# stdio face (:func:`serve_mcp_stdio`) on those descriptors, its kernel connection an in-memory
# link into the host's own session handling (``server/memory.py``: every gate applies), in a
# nursery of the session's own. The profile is resolved from the host's registry at
# ``mcp.adopt`` (an unknown name is refused there, before any descriptor moves), and
# ``host.mcp.maxAdopted`` bounds the sessions served at once (read at each ``mcp.adopt``, so a
# reload applies it).
"""

from __future__ import annotations

from typing import Any

import trio

from supervisor.mcp_face.face import backend_connector
from supervisor.mcp_face.profiles import Profile, from_patterns, named
from supervisor.mcp_face.stdio import serve_mcp_stdio
from supervisor.server.adopt import AdoptParams, AdoptRefused


class McpAdopter:
    """Serves adopted stdio sessions on ``host`` through ``backend`` (its kernel parts)."""

    def __init__(self, host: Any, backend: Any) -> None:
        self.host = host
        self.backend = backend
        self.live = 0
        """Adopted sessions served now (or accepted, their descriptors on the way)."""

    def check(self, params: AdoptParams) -> tuple[Profile | None, bool]:
        mcp = self.host.registry.host.mcp
        try:
            if params.tools is not None:
                profile: Profile | None = from_patterns(params.tools)
            elif params.profile is not None:
                profile = named(mcp, params.profile)
            else:
                profile = None
        except (KeyError, ValueError) as exc:
            raise AdoptRefused("invalid-params", str(exc.args[0])) from None
        return profile, params.telemetry

    def enter(self) -> None:
        cap = self.host.registry.host.mcp.max_adopted
        if self.live >= cap:
            raise AdoptRefused(
                "overloaded",
                f"the host already serves {cap} stdio MCP sessions (host.mcp.maxAdopted); "
                "end one, raise the limit, or run toolhost mcp --relay",
            )
        self.live += 1

    def leave(self) -> None:
        self.live -= 1

    async def serve(self, checked: Any, stdin_fd: int, stdout_fd: int, name: str) -> None:
        profile, telemetry = checked
        tracing = self.host.telemetry if telemetry else None
        async with trio.open_nursery() as nursery:
            connect = backend_connector(self.backend, nursery, f"mcp-adopted({name})")
            await serve_mcp_stdio(
                connect,
                stdin_fd=stdin_fd,
                stdout_fd=stdout_fd,
                tracing=tracing,
                profile=profile,
            )
