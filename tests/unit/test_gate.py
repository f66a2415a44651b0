"""The policy gate: visibility, sandbox and approval, before any worker (pure, table-driven)."""

import pytest

from supervisor.contracts.rpc import Approval
from supervisor.contracts.snapshot import (
    Annotations,
    Descriptor,
    Reason,
    Stability,
    StabilityDetails,
)
from supervisor.policy.gate import refuse
from supervisor.policy.quota import Refusal

WINDOW = Refusal(key="tool:t.x", rule="callsPerMinute", limit=3, retry_after_ms=1234)


def desc(sandbox="allowed", effective="available", visible=True, retry=None):
    reasons = [] if effective == "available" else [Reason(field="sandbox", code="x", message="why")]
    return Descriptor(
        name="t.x",
        description="",
        inputSchema={},
        sidecar="s",
        protocol="process-json",
        visible=visible,
        annotations=Annotations(),
        stability=Stability(
            discovery="configured",
            manifest="valid",
            path="resolved",
            version="unknown",
            probe="healthy",
            runtime="ready",
            sandbox=sandbox,
            upgrade="idle",
            effective=effective,
            reasons=reasons,
            details=StabilityDetails(retryAfterMs=retry),
        ),
    )


ALICE = Approval(granted=True, by="alice")


@pytest.mark.parametrize(
    ("d", "policy", "approval", "code"),
    [
        (desc(), "allowed", None, None),
        (desc(), "allowed", ALICE, None),
        (desc("approval-required"), "approval-required", None, "approval-required"),
        (
            desc("approval-required"),
            "approval-required",
            Approval(granted=False, by="a"),
            "approval-required",
        ),
        (
            desc("approval-required"),
            "approval-required",
            Approval(granted=True),
            "approval-required",
        ),
        (desc("approval-required"), "approval-required", ALICE, None),
        (desc("denied", "unavailable", False), "denied", ALICE, "sandbox-denied"),
        (desc("quota-limited", "degraded", False, 500), "allowed", None, "quota-limited"),
        # Visible while quota-limited (allowDegraded): the policy underneath still applies.
        (
            desc("quota-limited", "degraded", True, 500),
            "approval-required",
            None,
            "approval-required",
        ),
        (desc("quota-limited", "degraded", True, 500), "allowed", None, None),
        (desc("allowed", "unavailable", False), "allowed", ALICE, "not-visible"),
    ],
)
def test_gate(d, policy, approval, code):
    env = refuse(d, policy, approval, lambda: WINDOW)
    if code is None:
        assert env is None
    else:
        assert env.status == "unavailable" and env.error.code == code and env.meta.attempts == 0


def test_quota_limited_refusal_asks_for_a_fresh_retry_after():
    env = refuse(desc("quota-limited", "degraded", False, 60_000), "allowed", None, lambda: WINDOW)
    assert env.error.details["retryAfterMs"] == 1234
    assert env.error.details["reasons"][0]["code"] == "x"
    # The rule and limit, as docs/quotas-and-limits.md shows them (issue 26, item 18).
    assert env.content == "t.x: quota.tools.t.x.callsPerMinute=3 reached; retry in 1234 ms"
    assert env.error.details["rule"] == "callsPerMinute" and env.error.details["limit"] == 3
    assert env.error.details["scope"] == "tool:t.x"
    # The window reopened before the timer flipped the tool back: call again at once.
    env = refuse(desc("quota-limited", "degraded", False, 60_000), "allowed", None, lambda: None)
    assert env.error.code == "quota-limited" and env.error.details["retryAfterMs"] == 1


def test_unnamed_approval_says_so():
    env = refuse(
        desc("approval-required"), "approval-required", Approval(granted=True), lambda: None
    )
    assert "approval.by must name who approved" in env.content
