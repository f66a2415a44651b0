"""The Context a tool gets: its call, the sidecar's config and anchors, progress, host services.

# Strategy: a Context is made per call by the driver that runs it, so it stays a plain object
# with a handful of attributes and no work in its constructor (it is on the per-call path).
# Everything it sends goes through its sidecar's :class:`~sidecars.sdk.session.Session`
# (``progress``) or :mod:`sidecars.sdk.services` (``invoke``, ``state``, ``vault``). It knows its
# sidecar only as a :class:`SidecarView`, the part of ``sidecars.sdk.app.Sidecar`` that tools
# and drivers read, so this module and everything below it never import the app.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Awaitable, Callable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Protocol

from sidecars.sdk import services, tracing
from sidecars.sdk.engines import Missing
from sidecars.sdk.session import Session
from sidecars.sdk.tools import HealthMap, ToolError, ToolSpec

if TYPE_CHECKING:
    import trio


class SidecarView(Protocol):
    """What a tool (``ctx.app``) and a driver read of the sidecar (a ``Sidecar`` has it)."""

    name: str
    version: str
    concurrency: int
    tools: dict[str, ToolSpec]
    config: dict[str, Any]
    project_dir: str
    config_dir: str
    cwd: str
    sidecar_id: str
    session: Session

    @property
    def health_check(self) -> Callable[[Any], HealthMap | Awaitable[HealthMap]] | None:
        """The function registered with ``@app.health`` (None: every tool is healthy)."""

    def missing_engines(self) -> dict[str, Missing]:
        """Tool -> the declared engine it cannot import (checked once)."""


class Context:
    """What a tool call can see: config, anchors, cancellation and progress.

    For ``async def`` tools, :attr:`nursery` is the sidecar loop's long-lived nursery (tasks and
    connections started there outlive the call); it is ``None`` for sync tools.
    """

    def __init__(
        self,
        app: SidecarView,
        call_id: int | None,
        deadline_ms: int,
        cancelled: threading.Event,
    ) -> None:
        self.app = app
        self.call_id = call_id
        self.deadline_ms = deadline_ms
        self.cancelled = cancelled
        self.started = time.monotonic()
        self.nursery: trio.Nursery | None = None
        self.otel_context: Any = None
        """The OpenTelemetry context of the call's span (None: not traced; set by
        :func:`sidecars.sdk.tracing.run`)."""

    def time_left(self) -> float | None:
        """Seconds left before the call's deadline (``None`` when the call has none)."""
        if self.deadline_ms <= 0:
            return None
        return max(0.0, self.deadline_ms / 1000.0 - (time.monotonic() - self.started))

    @property
    def config(self) -> dict[str, Any]:
        return self.app.config

    @property
    def project_dir(self) -> str:
        return self.app.project_dir

    @property
    def cwd(self) -> str:
        return self.app.cwd

    def progress(self, data: Any) -> None:
        """Send a progress event for this call (ignored in oneshot mode)."""
        if self.call_id is not None and not self.cancelled.is_set():
            self.app.session.progress(self.call_id, data)

    # host services (PROTOCOL 3.5; docs/host-services.md) ---------------------------------

    def invoke(self, tool: str, input: Any, timeout_ms: int | None = None) -> Any:
        """Run another tool through the host (every gate of a kernel call applies); returns
        its envelope as an :class:`~sidecars.sdk.services.Invocation`. In an async tool,
        ``await ctx.invoke(...)``."""
        return services.invoke(self, tool, input, timeout_ms)

    def state(self, name: str) -> services.State:
        """The declared store ``name``: ``get``/``set``/``delete``/``list``."""
        return services.State(self, name)

    def vault(self, key: str) -> Any:
        """The operator's secret ``key`` (declared in the sidecar's ``vault``)."""
        return services.vault(self, key)

    def span(self, name: str, **attributes: Any) -> AbstractContextManager[Any]:
        """A span of the tool's own under this call's span (``with ctx.span("parse") as s:``).

        Without OpenTelemetry in the sidecar, or for a call the host did not trace, it yields
        a span whose methods do nothing, so tools need no ``if``.
        """
        return tracing.child_span(self.otel_context, name, attributes)

    def check_cancelled(self) -> None:
        """Raise :class:`ToolError` with code ``cancelled`` if the host cancelled the call.

        Sync tools poll this; async tools need not (a cancel is a real ``trio.Cancelled``).
        """
        if self.cancelled.is_set():
            raise ToolError("call cancelled", code="cancelled")
