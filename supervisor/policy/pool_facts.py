"""Pool state -> the snapshot's run-time fields (PROTOCOL 4), as a pure function.

# Strategy: a pool supplies plain facts (:class:`PoolState`: are workers serving, is a
# replacement on its way, did the sidecar ever become ready, did the restart policy give up, why
# the last worker ended, what the last pong said) and :func:`sidecar_facts` decides ``runtime``,
# ``probe``, the per-tool values, the reasons and the details. The rules, first match wins:
#
# 1. a worker serves, or an idle ``pool.min: 0`` pool       -> ready
# 2. stopped (the pool is shutting down)                   -> failed, code ``stopped``
# 3. it was ready before and a replacement's start failed
#    (exited, refused, or no ``ready`` in time), with no
#    successful start since                                 -> failed, code ``start-failed``
# 4. it was ready before, a replacement is on its way and
#    the restart intensity holds (the restart window)       -> ready, details.restarting
# 5. never ready, nothing ended yet                         -> starting
# 6. the last worker overran its start deadline             -> timed-out
# 7. the last worker broke the protocol                     -> schema-error
# 8. otherwise                                              -> failed (``gave-up`` past the
#                                                              intensity, else ``restarting``)
#
# The restart window (4) covers starting a replacement, not a sidecar that cannot start (3):
# the model must not keep calling a tool whose every call would wait out its deadline.
#
# ``probe`` is the last pong's while ready, ``skipped`` otherwise; a declared tool the sidecar's
# ``ready`` does not list is ``schema-error`` with reason ``tool-not-served``.
"""

from __future__ import annotations

import msgspec

from supervisor.contracts.confine import ConfinementFacts
from supervisor.contracts.facts import STARTING_REASON, SidecarFacts, ToolProbe, ToolRuntime
from supervisor.contracts.snapshot import ProbeState, Reason, RuntimeState, StabilityDetails
from supervisor.contracts.wire import ToolInfo


class PoolState(msgspec.Struct, frozen=True, kw_only=True):
    """The facts a pool knows about its sidecar now."""

    sidecar: str
    protocol: str = "process-json"
    serving: bool = False
    """A worker is ready (or draining its last calls)."""
    replacing: bool = False
    """A replacement worker is in backoff or starting."""
    ever_ready: bool = False
    idle_ok: bool = False
    """``pool.min: 0`` and the sidecar proved it starts: no worker is needed until a call."""
    stopped: bool = False
    gave_up: bool = False
    """The restart policy gave up (intensity exceeded, or a policy that does not restart)."""
    start_failed: bool = False
    """The last worker ended before ``ready`` (its start failed) and none was ready since."""
    exit_reason: str | None = None
    exit_message: str | None = None
    exit_code: int | None = None
    stderr_tail: str | None = None
    confinement: ConfinementFacts | None = None
    """The walls of a running worker, read from it (PROTOCOL 7)."""
    restarts: int = 0
    next_restart_ms: float | None = None
    probed: bool = True
    """The sidecar has a health probe (``probe.intervalMs > 0``)."""
    probe: ProbeState = "healthy"
    probe_reason: Reason | None = None
    tool_probe: dict[str, ToolProbe] = msgspec.field(default_factory=dict)
    announced: dict[str, ToolInfo] | None = None
    declared_tools: tuple[str, ...] = ()


def runtime_of(s: PoolState) -> tuple[RuntimeState, Reason | None, bool]:
    """The sidecar's ``runtime``, its reason, and whether it is in the restart window."""
    sid = s.sidecar
    if s.serving or s.idle_ok:
        return "ready", None, False
    if s.stopped:
        return "failed", _reason("stopped", f"sidecar {sid} is stopped", _logs_hint(sid)), False
    if s.ever_ready and s.start_failed and not s.gave_up:
        why = s.exit_message or "the replacement worker did not start"
        if s.next_restart_ms is not None:
            why += f"; retrying in {round(s.next_restart_ms)} ms"
        hint = _logs_hint(sid) + "; it is ready again after the next successful start"
        return "failed", _reason("start-failed", f"{sid} cannot start: {why}", hint), False
    if s.ever_ready and s.replacing and not s.gave_up:
        return "ready", None, True
    if s.exit_reason is None:
        return "starting", STARTING_REASON, False
    message = s.exit_message or "no worker can serve"
    if s.exit_reason == "start-timeout":
        hint = f"raise sidecars.{sid}.probe.startTimeoutMs or fix its start-up"
        return "timed-out", _reason("start-timeout", message, hint), False
    if s.exit_reason == "protocol-error":
        hint = f"the sidecar broke the {s.protocol} protocol; see `toolhost logs {sid}`"
        return "schema-error", _reason("protocol-error", message, hint), False
    hint = _logs_hint(sid)
    if s.gave_up:
        return (
            "failed",
            _reason(
                "gave-up",
                f"crash loop past the restart intensity: {message}",
                hint + "; it is retried slowly",
            ),
            False,
        )
    if s.next_restart_ms is not None:
        message += "; restarting after backoff"
    return "failed", _reason("restarting", message, hint), False


def sidecar_facts(s: PoolState) -> SidecarFacts:
    """Everything the catalog needs to know about the sidecar (see the module's rules)."""
    runtime, reason, restarting = runtime_of(s)
    ready = runtime == "ready"
    probe: ProbeState = s.probe
    if not s.probed and probe == "healthy":
        probe = "skipped"
    return SidecarFacts(
        runtime=runtime,
        runtime_reason=reason,
        probe=probe if ready else "skipped",
        probe_reason=s.probe_reason if ready else None,
        tool_runtime=_unserved(s),
        tool_probe=s.tool_probe if ready else {},
        announced=s.announced,
        details=StabilityDetails(
            restarts=s.restarts,
            lastExitCode=s.exit_code,
            lastExitReason=s.exit_reason,
            stderrTail=s.stderr_tail if s.exit_reason is not None else None,
            nextRestartMs=s.next_restart_ms,
            restarting=restarting,
            confinement=s.confinement,
        ),
    )


def _unserved(s: PoolState) -> dict[str, ToolRuntime]:
    announced = s.announced
    if not announced:
        return {}
    return {
        tool: ToolRuntime(
            state="schema-error",
            reason=Reason(
                field="runtime",
                code="tool-not-served",
                message=f"{s.sidecar}'s ready message does not list {tool}",
                hint=f"remove {tool} from sidecars.{s.sidecar}.tools or update the sidecar",
            ),
        )
        for tool in s.declared_tools
        if tool not in announced
    }


def _reason(code: str, message: str, hint: str) -> Reason:
    return Reason(field="runtime", code=code, message=message, hint=hint)


def _logs_hint(sid: str) -> str:
    return f"see `toolhost logs {sid}` for its stderr"
