"""Pure rules of the upgrade life cycle: the snapshot's ``upgrade`` field, start verdicts, and
what a verdict leaves behind.

# Strategy: the package manager's own records are the truth for a package it manages; these
# functions turn them into the one word the snapshot shows and into the reason behind it. The
# host feeds :func:`judge_start` the pool's facts after every change until the verdict is no
# longer ``pending``; :func:`settle` decides what a verdict leaves behind. No I/O, no clock.
"""

from __future__ import annotations

from typing import Literal

from supervisor.contracts.snapshot import Reason, UpgradeField
from supervisor.packages.journal import Journal, UpgradeRecord
from supervisor.registry.catalog import SidecarFacts

Verdict = Literal["pending", "ready", "failed", "skipped"]


def derive_upgrade(
    *, journal: Journal | None, record: UpgradeRecord | None, staged: str | None
) -> UpgradeField:
    """The ``upgrade`` field of a managed package, first match wins.

    1. an unfinished transaction for it, or a version applied but not yet seen ready: applying
    2. an operator decision pending: rollback-required or failed
    3. a version staged: staged
    4. otherwise: idle
    """
    if journal is not None or (record is not None and record.state == "verifying"):
        return "applying"
    if record is not None:
        return record.state  # type: ignore[return-value]
    if staged is not None:
        return "staged"
    return "idle"


def upgrade_reason(
    pid: str,
    state: UpgradeField,
    *,
    journal: Journal | None,
    record: UpgradeRecord | None,
) -> Reason | None:
    """The specific reason for a hiding ``upgrade`` value (None for idle and staged)."""
    if state == "applying":
        if journal is not None:
            verb = "rolling back" if journal.op == "rollback" else "applying"
            what = f"{verb} {pid} {journal.fromVersion or '(none)'} -> {journal.toVersion}"
        else:
            assert record is not None
            verb = "rolling back" if record.op == "rollback" else "applying"
            what = (
                f"{verb} {pid} {record.fromVersion or '(none)'} -> {record.toVersion}: "
                "installed, waiting for a host to see it ready"
            )
        return Reason(
            field="upgrade",
            code="upgrade-applying",
            message=what,
            hint="wait for `toolhost pkg status` to show idle",
        )
    if state == "rollback-required":
        return Reason(
            field="upgrade",
            code="rollback-required",
            message=record.message if record else f"{pid}: the new version failed",
            hint=f"decide: `toolhost pkg rollback {pid} --yes`, or stage and apply a fixed version",
        )
    if state == "failed":
        return Reason(
            field="upgrade",
            code="upgrade-failed",
            message=record.message if record else f"{pid}: the upgrade failed",
            hint=f"stage a working version of {pid} and apply it; `toolhost pkg status` "
            "shows what is installed",
        )
    return None


def judge_start(facts: SidecarFacts | None, *, runnable: bool, problem: str) -> tuple[Verdict, str]:
    """Whether a freshly (re)started sidecar came up.

    Args:
        facts: Its pool's facts now (None: no pool).
        runnable: Whether the plan lets it run at all.
        problem: Why not, when it cannot run (``disabled``, a path problem, ...).

    Returns:
        ``(verdict, message)``. ``ready`` needs a worker that sent ``ready``, answered its first
        probe with something other than ``unavailable``, and serves every declared tool. Any
        worker exit before the first ready, a start timeout or a protocol break is ``failed``
        (a new version gets no restart budget to hide a bad start). ``skipped``: a disabled
        sidecar is not started, so there is nothing to verify.
    """
    if not runnable:
        if problem == "disabled":
            return "skipped", "the sidecar is disabled: not started, not verified"
        return "failed", f"cannot start: {problem or 'not runnable'}"
    if facts is None:
        return "pending", ""
    if facts.runtime == "ready":
        broken = sorted(t for t, tr in facts.tool_runtime.items() if tr.state != "ready")
        if broken:
            reason = facts.tool_runtime[broken[0]].reason
            return "failed", reason.message if reason else f"does not serve {broken[0]}"
        if facts.probe == "unavailable":
            why = facts.probe_reason.message if facts.probe_reason else "reports unavailable"
            return "failed", f"probe: {why}"
        unhealthy = sorted(t for t, p in facts.tool_probe.items() if p.state == "unavailable")
        if unhealthy:
            return "failed", f"probe: {', '.join(unhealthy)} unavailable"
        return "ready", ""
    reason = facts.runtime_reason
    if reason is not None and reason.code == "starting":
        return "pending", ""
    message = reason.message if reason is not None else f"runtime {facts.runtime}"
    return "failed", f"{facts.runtime}: {message}"


def settle(
    pid: str, record: UpgradeRecord, verdict: Verdict, message: str, *, has_previous: bool
) -> tuple[UpgradeRecord | None, bool]:
    """What a verdict on ``record`` leaves behind, and whether to roll back automatically.

    Returns:
        ``(new_record, auto_rollback)``; ``new_record`` None means the package is idle.
    """
    if verdict in ("ready", "skipped"):
        return None, False
    what = f"{pid} {record.toVersion} failed its start or probe: {message}"
    if record.op == "rollback":
        return (
            UpgradeRecord(
                state="failed",
                op="rollback",
                fromVersion=record.fromVersion,
                toVersion=record.toVersion,
                message=f"the restored version: {what}",
            ),
            False,
        )
    if not has_previous:
        return (
            UpgradeRecord(
                state="failed",
                op="apply",
                fromVersion=record.fromVersion,
                toVersion=record.toVersion,
                message=f"{what}; there is no previous version to restore",
            ),
            False,
        )
    return (
        UpgradeRecord(
            state="rollback-required",
            op="apply",
            fromVersion=record.fromVersion,
            toVersion=record.toVersion,
            autoRollback=record.autoRollback,
            message=f"{what}; {record.fromVersion or 'the previous version'} is kept in "
            f"tools/packages/.previous/{pid}",
        ),
        record.autoRollback,
    )
