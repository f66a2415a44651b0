"""The upgrade life cycle's pure rules: snapshot field, start verdicts, what a verdict leaves."""

import msgspec
import pytest

from supervisor.contracts.snapshot import Reason
from supervisor.packages.journal import Journal, UpgradeRecord
from supervisor.packages.states import derive_upgrade, judge_start, settle, upgrade_reason
from supervisor.policy.version import compatibility
from supervisor.registry.catalog import NOT_STARTED, SidecarFacts, ToolProbe, ToolRuntime

J = Journal(
    tx="t", op="apply", id="g", fromVersion="1", toVersion="2", moves=[], registryBefore="",
    registryAfter="",
)  # fmt: skip
VERIFYING = UpgradeRecord(state="verifying", op="apply", fromVersion="1", toVersion="2")
RB_REQ = UpgradeRecord(state="rollback-required", op="apply", toVersion="2", message="m")
FAILED = UpgradeRecord(state="failed", op="rollback", toVersion="1", message="m2")


@pytest.mark.parametrize(
    ("journal", "record", "staged", "state"),
    [
        (None, None, None, "idle"),
        (None, None, "g@3", "staged"),
        (J, None, "g@3", "applying"),
        (None, VERIFYING, "g@3", "applying"),
        (None, RB_REQ, "g@3", "rollback-required"),
        (None, FAILED, None, "failed"),
        (J, RB_REQ, None, "applying"),
    ],
)
def test_derive_upgrade(journal, record, staged, state):
    assert derive_upgrade(journal=journal, record=record, staged=staged) == state
    reason = upgrade_reason("g", state, journal=journal, record=record)
    assert (reason is None) == (state in ("idle", "staged"))
    if reason is not None:
        assert reason.field == "upgrade" and reason.hint


def r(code, message="m"):
    return Reason(field="runtime", code=code, message=message)


READY = SidecarFacts(runtime="ready", probe="healthy")


@pytest.mark.parametrize(
    ("facts", "runnable", "problem", "verdict", "fragment"),
    [
        (None, True, "", "pending", ""),
        (NOT_STARTED, True, "", "pending", ""),
        (READY, True, "", "ready", ""),
        (SidecarFacts(runtime="ready", probe="skipped"), True, "", "ready", ""),
        (SidecarFacts(runtime="ready", probe="degraded"), True, "", "ready", ""),
        (
            SidecarFacts(
                runtime="ready",
                probe="unavailable",
                probe_reason=Reason(field="probe", code="p", message="db down"),
            ),
            True,
            "",
            "failed",
            "probe: db down",
        ),
        (
            SidecarFacts(
                runtime="ready",
                probe="healthy",
                tool_probe={"a": ToolProbe(state="unavailable")},
            ),
            True,
            "",
            "failed",
            "a unavailable",
        ),
        (
            SidecarFacts(
                runtime="ready",
                tool_runtime={"a": ToolRuntime(state="schema-error", reason=r("x", "no a"))},
            ),
            True,
            "",
            "failed",
            "no a",
        ),
        (
            SidecarFacts(runtime="failed", runtime_reason=r("restarting", "exited before ready")),
            True,
            "",
            "failed",
            "exited before ready",
        ),
        (
            SidecarFacts(runtime="timed-out", runtime_reason=r("start-timeout", "no ready")),
            True,
            "",
            "failed",
            "timed-out: no ready",
        ),
        (None, False, "disabled", "skipped", "disabled"),
        (None, False, "command 'x' not found on PATH", "failed", "cannot start: command"),
    ],
)
def test_judge_start(facts, runnable, problem, verdict, fragment):
    got, message = judge_start(facts, runnable=runnable, problem=problem)
    assert got == verdict
    assert fragment in message


def test_settle():
    assert settle("g", VERIFYING, "ready", "", has_previous=True) == (None, False)
    assert settle("g", VERIFYING, "skipped", "", has_previous=False) == (None, False)
    rec, auto = settle("g", VERIFYING, "failed", "boom", has_previous=True)
    assert rec.state == "rollback-required" and not auto
    assert "g 2 failed its start or probe: boom" in rec.message and ".previous/g" in rec.message
    auto_rec = msgspec.structs.replace(VERIFYING, autoRollback=True)
    rec, auto = settle("g", auto_rec, "failed", "boom", has_previous=True)
    assert rec.state == "rollback-required" and auto
    rec, auto = settle("g", auto_rec, "failed", "boom", has_previous=False)
    assert rec.state == "failed" and not auto and "no previous version" in rec.message
    back = UpgradeRecord(state="verifying", op="rollback", fromVersion="2", toVersion="1")
    rec, auto = settle("g", back, "failed", "also broken", has_previous=True)
    assert rec.state == "failed" and not auto and "the restored version" in rec.message


@pytest.mark.parametrize(
    ("core", "protocol", "version", "state"),
    [
        (">=0.1", "1", "process-json", "compatible"),
        (">=0.1", None, "process-json", "compatible"),
        (None, "1", "process-json", "unknown"),
        (">=0.1", "2", "process-json", "incompatible"),
        (">=9", "2", "process-json", "incompatible"),
        (">=0.1", "2025-11-25", "mcp", "compatible"),
    ],
)
def test_protocol_version_joins_compatibility(core, protocol, version, state):
    got, message = compatibility("0.1.0", core, protocol=version, protocol_version=protocol)
    assert got == state
    assert bool(message) == (state == "incompatible")
