"""What a pool knows about its sidecar, as the catalog consumes it (internal, not on the wire)."""

from __future__ import annotations

import msgspec

from supervisor.contracts.snapshot import (
    ProbeState,
    Reason,
    RuntimeState,
    StabilityDetails,
)
from supervisor.contracts.wire import ToolInfo


class ToolRuntime(msgspec.Struct, frozen=True, kw_only=True):
    state: RuntimeState
    reason: Reason | None = None


class ToolProbe(msgspec.Struct, frozen=True, kw_only=True):
    state: ProbeState
    reason: Reason | None = None


class SidecarFacts(msgspec.Struct, frozen=True, kw_only=True):
    """What a pool knows about its sidecar now."""

    runtime: RuntimeState = "starting"
    runtime_reason: Reason | None = None
    probe: ProbeState = "skipped"
    probe_reason: Reason | None = None
    tool_runtime: dict[str, ToolRuntime] = msgspec.field(default_factory=dict)
    tool_probe: dict[str, ToolProbe] = msgspec.field(default_factory=dict)
    announced: dict[str, ToolInfo] | None = None
    """Tools the sidecar said it serves (None: it has not said yet)."""
    details: StabilityDetails = msgspec.field(default_factory=StabilityDetails)


STARTING_REASON = Reason(
    field="runtime",
    code="starting",
    message="the sidecar is starting: no worker has sent ready yet",
    hint="wait a moment; `toolhost status` shows its progress",
)

NOT_STARTED = SidecarFacts(runtime="starting", runtime_reason=STARTING_REASON)
