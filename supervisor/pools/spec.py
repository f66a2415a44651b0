"""What a pool is made from: the child spec (what to start, how the pool is shaped) and its
collaborators (whom it tells what happened, whom it asks).

# Strategy: as in OTP's ``supervisor.erl``, a pool starts and restarts its workers from one
# *child spec*: how to build a worker (:data:`WorkerFactory`), how to launch its process (a
# fresh :class:`~supervisor.workers.base.LaunchSpec` at every start, so a vault value or a
# reloaded path applies to the next worker) and the configuration that shapes the pool and its
# restart policy. ``host/launch.py`` builds it from a sidecar's plan; the pool never sees the
# plan, the registry or the host. Everything else a pool talks to is handed in at construction
# as one :class:`Collaborators` record: nothing is set on a pool afterwards.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

import msgspec

from supervisor.calls.call import Call
from supervisor.contracts import wire
from supervisor.contracts.facts import SidecarFacts
from supervisor.contracts.registry import SidecarConfig
from supervisor.pools.guard import HostGuard
from supervisor.telemetry.events import EventBus
from supervisor.telemetry.logs import StderrLines
from supervisor.workers.base import LaunchSpec, Worker, WorkerHooks

if TYPE_CHECKING:  # OpenTelemetry is imported only when telemetry is on
    from supervisor.telemetry.metering import Metering

WorkerFactory = Callable[[LaunchSpec, WorkerHooks, int], Worker]
"""Builds worker number ``index`` of a sidecar from its launch spec, reporting to ``hooks``."""

Publish = Callable[[str, SidecarFacts], None]
"""Receives a sidecar's facts for the catalog whenever they change."""


class Services(Protocol):
    """What a pool hands workers' host-service requests to."""

    def handle(
        self, call: Call, req: wire.Request, reply: Callable[[wire.Response], None]
    ) -> None: ...


class ChildSpec(msgspec.Struct, frozen=True, kw_only=True):
    """Everything a pool needs to start and restart the workers of one sidecar."""

    sidecar: str
    config: SidecarConfig
    """The configuration the pool runs with: its shape (``pool``), ``restart``, ``probe``,
    ``timeout_ms`` (per-call protocols: one call site, no pings; see ``host/launch.py``)."""
    launch: Callable[[], LaunchSpec]
    """The spawn recipe of the next worker, built at each start."""
    factory: WorkerFactory
    """The worker class for the sidecar's protocol and mode."""
    declared_tools: tuple[str, ...] = ()
    """Tools the registry assigns (checked against what the sidecar's ``ready`` lists)."""


def _nothing() -> None:
    return None


class Collaborators(msgspec.Struct, frozen=True, kw_only=True):
    """Whom a pool tells what happened and asks for what (all handed in at construction)."""

    publish: Publish
    """Receives the sidecar's facts for the catalog when they change."""
    notify: Callable[[], None] = _nothing
    """Called on every state change, facts changed or not (workers, backoff)."""
    guard: HostGuard | None = None
    """The host-wide start slots and restart budget (None: unlimited)."""
    services: Services | None = None
    """Answers workers' host-service requests (None: the host offers none)."""
    redact: Callable[[str], str] | None = None
    """Masks every secret handed out from stderr tails and log lines."""
    metering: Metering | None = None
    """OpenTelemetry instruments, or None when telemetry is off."""
    stderr_lines: StderrLines | None = None
    """JSON logs: forwards workers' stderr lines as records; None with text logs."""
    events: EventBus | None = None
    """The host's operator event bus (``worker.changed``, ``log.line``)."""
    rng: random.Random = msgspec.field(default_factory=random.Random)
    """Seeded generator for the backoff jitter."""
