"""PROTOCOL 4's mapping over every combination of the eight inputs."""

import itertools
import typing

import pytest

from supervisor.contracts import snapshot
from supervisor.policy.availability import Facts, assess, effective, generic_reason, problems

VALUES = {
    "discovery": typing.get_args(snapshot.Discovery),
    "manifest": typing.get_args(snapshot.ManifestState),
    "path": typing.get_args(snapshot.PathState),
    "version": typing.get_args(snapshot.VersionState),
    "probe": typing.get_args(snapshot.ProbeState),
    "runtime": typing.get_args(snapshot.RuntimeState),
    "sandbox": typing.get_args(snapshot.SandboxState),
    "upgrade": typing.get_args(snapshot.UpgradeField),
}

# An independent statement of the rules: each value's severity; the worst one wins.
SEVERITY = {
    ("discovery", "disabled"): 3,
    ("discovery", "missing"): 2,
    ("manifest", "invalid"): 2,
    ("path", "unresolved"): 2,
    ("path", "outside-root-denied"): 2,
    ("version", "incompatible"): 2,
    ("upgrade", "applying"): 2,
    ("upgrade", "rollback-required"): 2,
    ("upgrade", "failed"): 2,
    ("sandbox", "denied"): 2,
    ("runtime", "starting"): 2,
    ("runtime", "failed"): 2,
    ("runtime", "timed-out"): 2,
    ("runtime", "schema-error"): 2,
    ("probe", "unavailable"): 2,
    ("probe", "degraded"): 1,
    ("sandbox", "quota-limited"): 1,
}
NAMES = {0: "available", 1: "degraded", 2: "unavailable", 3: "disabled"}


def all_facts():
    keys = list(VALUES)
    for combo in itertools.product(*(VALUES[k] for k in keys)):
        yield Facts(**dict(zip(keys, combo)))


def test_value_sets_match_protocol():
    assert VALUES["discovery"] == ("configured", "missing", "disabled")
    assert VALUES["probe"] == ("healthy", "degraded", "unavailable", "skipped")
    assert VALUES["sandbox"] == ("allowed", "approval-required", "denied", "quota-limited")
    assert VALUES["runtime"] == ("starting", "ready", "failed", "timed-out", "schema-error")
    assert len(list(all_facts())) == 3 * 2 * 3 * 3 * 4 * 5 * 4 * 5


def test_every_combination():
    count = 0
    for f in all_facts():
        worst = max((SEVERITY.get((k, getattr(f, k)), 0) for k in VALUES), default=0)
        expected = NAMES[worst]
        assert effective(f) == expected, f
        eff, reasons = assess(f)
        assert eff == expected
        # Reasons are empty exactly when available, and each names a field that is a problem.
        assert (reasons == []) == (expected == "available"), f
        bad = {k for k in VALUES if (k, getattr(f, k)) in SEVERITY}
        assert {r.field for r in reasons} == (bad if expected != "available" else set())
        assert all(r.hint and r.message and r.code for r in reasons)
        count += 1
    assert count == 21600


@pytest.mark.parametrize(
    ("facts", "expected"),
    [
        (Facts(), "available"),
        (Facts(version="unknown", upgrade="staged"), "available"),
        (Facts(sandbox="approval-required"), "available"),
        (Facts(probe="skipped"), "available"),
        (Facts(probe="degraded"), "degraded"),
        (Facts(sandbox="quota-limited", probe="degraded"), "degraded"),
        (Facts(discovery="disabled", runtime="failed"), "disabled"),
        (Facts(upgrade="applying"), "unavailable"),
        (Facts(sandbox="denied", probe="degraded"), "unavailable"),
    ],
)
def test_named_cases(facts, expected):
    assert effective(facts) == expected


def test_specific_reason_replaces_generic_and_hint_names_sidecar():
    f = Facts(probe="unavailable")
    specific = snapshot.Reason(
        field="probe",
        code="no-provider",
        message="no providers configured",
        hint="add a provider under sidecars.web.config.providers",
    )
    eff, reasons = assess(f, {"probe": specific}, "web")
    assert eff == "unavailable"
    assert reasons == [specific]
    generic = generic_reason("runtime", "timed-out", "web")
    assert "sidecars.web.probe.startTimeoutMs" in generic.hint
    assert problems(Facts(path="unresolved", runtime="failed")) == [
        ("path", "unresolved"),
        ("runtime", "failed"),
    ]
