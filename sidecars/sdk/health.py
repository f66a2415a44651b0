"""A ping's answer: the sidecar's health check, with the tools whose engines failed on top.

# Strategy: a driver answers ``ping`` in two steps so that the check itself can be sync (the
# thread driver calls it on the reading thread) or async (the Trio driver awaits it in a task):
# :func:`check` starts the check (or skips it when no tool has its engines, answering ``{}``),
# and :func:`pong` turns its answer, or the exception it raised (``degraded``, logged), into the
# ``Pong`` with every engine problem merged in, so ``unavailable`` for a missing engine shows in
# the very first pong whatever the check says.
"""

from __future__ import annotations

from collections.abc import Awaitable

from sidecars.sdk.context import SidecarView
from sidecars.sdk.stdio import log
from sidecars.sdk.tools import HealthMap
from supervisor.contracts import wire


def check(app: SidecarView) -> HealthMap | Awaitable[HealthMap]:
    """Run ``app``'s health check: its map, or an awaitable of it (an async check).

    Not run (``{}``) without a check or when no tool has its engines.
    """
    health_check = app.health_check
    if health_check is None or set(app.tools) <= set(app.missing_engines()):
        return {}
    return health_check(app)


def pong(app: SidecarView, ping_id: str, answer: HealthMap | Exception) -> wire.Pong:
    """The ``pong`` for the check's ``answer`` (an exception: it raised, so ``degraded``)."""
    status: wire.HealthStatus = "healthy"
    if isinstance(answer, Exception):
        status = "degraded"
        log(app.name, "error", f"health check raised: {answer!r}")
        answer = {}
    engines = {tool: missing.health() for tool, missing in app.missing_engines().items()}
    return wire.Pong(id=ping_id, status=status, tools={**answer, **engines})
