"""The stability snapshot every tool descriptor carries (PROTOCOL 4), and the descriptor."""

from __future__ import annotations

from typing import Any, Literal

import msgspec
from msgspec import Struct

from supervisor.contracts.confine import ConfinementFacts

Discovery = Literal["configured", "missing", "disabled"]
ManifestState = Literal["valid", "invalid"]
PathState = Literal["resolved", "unresolved", "outside-root-denied"]
VersionState = Literal["compatible", "incompatible", "unknown"]
ProbeState = Literal["healthy", "degraded", "unavailable", "skipped"]
RuntimeState = Literal["starting", "ready", "failed", "timed-out", "schema-error"]
SandboxState = Literal["allowed", "approval-required", "denied", "quota-limited"]
UpgradeField = Literal["idle", "staged", "applying", "rollback-required", "failed"]
Effective = Literal["available", "degraded", "unavailable", "disabled"]

STABILITY_FIELDS = (
    "discovery",
    "manifest",
    "path",
    "version",
    "probe",
    "runtime",
    "sandbox",
    "upgrade",
)


class Reason(Struct, frozen=True, kw_only=True):
    """Why a tool is not plainly available: which field, a stable code, and what to do."""

    field: str
    code: str
    message: str
    hint: str = ""


class PathDetails(Struct, frozen=True, kw_only=True, omit_defaults=True):
    """How a sidecar's command was resolved. ``base`` is the anchor name, never a path."""

    base: str
    command: str
    mode: Literal["relative", "path"] | None = None
    portable: bool = True
    rootSafe: bool = True
    resolved: str | None = None


class StabilityDetails(Struct, frozen=True, kw_only=True, omit_defaults=True):
    """Run-time detail behind the nine fields; absent keys mean "nothing to say"."""

    path: PathDetails | None = None
    restarts: int = 0
    lastExitCode: int | None = None
    lastExitReason: str | None = None
    stderrTail: str | None = None
    nextRestartMs: float | None = None
    restarting: bool = False
    """A replacement worker is starting inside the restart intensity (runtime stays ready)."""
    retryAfterMs: int | None = None
    protocolError: str | None = None
    install: str | None = None
    confinement: ConfinementFacts | None = None
    """What the running worker's kernel walls are, read from it (PROTOCOL 7)."""


class Stability(Struct, frozen=True, kw_only=True):
    """The nine fields, reasons and details."""

    discovery: Discovery
    manifest: ManifestState
    path: PathState
    version: VersionState
    probe: ProbeState
    runtime: RuntimeState
    sandbox: SandboxState
    upgrade: UpgradeField
    effective: Effective
    reasons: list[Reason] = msgspec.field(default_factory=list)
    details: StabilityDetails = msgspec.field(default_factory=StabilityDetails)


class Annotations(Struct, frozen=True, kw_only=True, omit_defaults=True):
    """Behavioural hints from the manifest, passed through to the kernel."""

    readOnly: bool = False
    concurrencySafe: bool = False
    exclusive: bool = False
    permission: str | None = None
    resultLimit: int | None = None
    timeoutMs: int | None = None
    requires: list[str] = msgspec.field(default_factory=list)
    outputSchema: dict[str, Any] | None = None


class Descriptor(Struct, frozen=True, kw_only=True):
    """One tool as the kernel sees it in ``capability.catalog.get``."""

    name: str
    description: str
    inputSchema: dict[str, Any]
    sidecar: str | None
    protocol: str | None
    visible: bool
    annotations: Annotations
    stability: Stability


class WorkerStatus(Struct, frozen=True, kw_only=True, omit_defaults=True):
    pid: int
    state: str
    inflight: int = 0
    calls: int = 0
    uptimeMs: float = 0
    startedBy: Literal["zygote", "exec"]
    """How the worker process started (PROTOCOL 1 ``spawn``)."""
    startMs: float | None = None
    """From the start request to ``ready`` (None until ready)."""


class ZygoteStatus(Struct, frozen=True, kw_only=True, omit_defaults=True):
    """The zygote in ``capability.catalog.get`` and ``toolhost status``."""

    state: str
    """``ready``, ``starting``, ``restarting``, ``off`` or ``unavailable``."""
    pid: int | None = None
    rssBytes: int | None = None
    forks: int = 0
    fallbacks: int = 0
    restarts: int = 0
    preloaded: list[str] = msgspec.field(default_factory=list)
    preloadFailed: list[str] = msgspec.field(default_factory=list)
    """``module: error`` of every preload that could not be imported."""
    reason: str | None = None
    """Why it is not ready, or the last fallback's reason."""


class SidecarStatus(Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One sidecar in ``capability.catalog.get`` and ``toolhost status``."""

    id: str
    protocol: str
    mode: str
    enabled: bool
    manifest: ManifestState
    runtime: RuntimeState | Literal["starting", "stopped", "backoff"]
    tools: list[str] = msgspec.field(default_factory=list)
    workers: list[WorkerStatus] = msgspec.field(default_factory=list)
    queued: int = 0
    restarts: int = 0
    lastExitCode: int | None = None
    lastExitReason: str | None = None
    nextRestartMs: float | None = None
    errors: list[str] = msgspec.field(default_factory=list)
    confinement: str | None = None
    """Its kernel walls in one word (PROTOCOL 7, ``toolhost status``): ``fs+net+seccomp``
    (what a worker of it has, read from it; before one ran, what its plan enforces), ``off``,
    or ``denied`` (``host.confinement: required`` cannot be met: nothing is started)."""
    shadowed: list[dict[str, str]] = msgspec.field(default_factory=list)
    """MCP sidecars: what this sidecar's server publishes that another sidecar earlier in the
    registry owns, ``{kind: tool|resource|resourceTemplate|prompt, name, shadowedBy}``."""
