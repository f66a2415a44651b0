"""The stability mapping of PROTOCOL 4: eight facts in, ``effective`` and reasons out.

# Strategy: ``effective`` is a first-match function of the eight fields. Reasons are built per
# problematic field; the runtime may supply a specific reason (with the sidecar's own words and
# hint) for a field, otherwise a generic one from ``_GENERIC`` is used. Reasons are empty exactly
# when the tool is available.
"""

from __future__ import annotations

from collections.abc import Mapping

from msgspec import Struct

from supervisor.contracts.snapshot import (
    Discovery,
    Effective,
    ManifestState,
    PathState,
    ProbeState,
    Reason,
    RuntimeState,
    SandboxState,
    UpgradeField,
    VersionState,
)


class Facts(Struct, frozen=True, kw_only=True):
    """The eight inputs of the mapping, defaulting to a healthy, configured tool."""

    discovery: Discovery = "configured"
    manifest: ManifestState = "valid"
    path: PathState = "resolved"
    version: VersionState = "unknown"
    probe: ProbeState = "skipped"
    runtime: RuntimeState = "ready"
    sandbox: SandboxState = "allowed"
    upgrade: UpgradeField = "idle"


HIDING_UPGRADES = frozenset(("applying", "rollback-required", "failed"))
FAILED_RUNTIMES = frozenset(("starting", "failed", "timed-out", "schema-error"))


def effective(f: Facts) -> Effective:
    """PROTOCOL 4's rules, first match wins."""
    if f.discovery == "disabled":
        return "disabled"
    if (
        f.discovery == "missing"
        or f.manifest == "invalid"
        or f.path != "resolved"
        or f.version == "incompatible"
        or f.upgrade in HIDING_UPGRADES
        or f.sandbox == "denied"
        or f.runtime in FAILED_RUNTIMES
        or f.probe == "unavailable"
    ):
        return "unavailable"
    if f.probe == "degraded" or f.sandbox == "quota-limited":
        return "degraded"
    return "available"


# (field, value) -> (code, message, hint). Only values that make a tool less than available.
_GENERIC: dict[tuple[str, str], tuple[str, str, str]] = {
    ("discovery", "disabled"): (
        "sidecar-disabled",
        "the sidecar serving this tool is disabled",
        'set "enabled": true on its entry in tools/external.tools.jsonc',
    ),
    ("discovery", "missing"): (
        "not-configured",
        "no sidecar in the registry serves this tool",
        "add a sidecar entry that lists it under tools in tools/external.tools.jsonc "
        "(`toolhost init` writes one for the bundled sidecars)",
    ),
    ("manifest", "invalid"): (
        "manifest-invalid",
        "the registry entry for this tool's sidecar is invalid",
        "fix the entry in tools/external.tools.jsonc; `toolhost doctor` names the JSON path",
    ),
    ("path", "unresolved"): (
        "command-not-found",
        "the sidecar's command could not be found",
        "install the command or fix sidecars.<id>.command",
    ),
    ("path", "outside-root-denied"): (
        "outside-root-denied",
        "the sidecar's command is absolute or leaves its cwd anchor",
        "use a relative command such as ./tools/packages/<id>/bin/<cmd> or a bare PATH name",
    ),
    ("version", "incompatible"): (
        "version-incompatible",
        "the sidecar package is not compatible with this toolhost",
        "install a package version whose compatibleCore admits this toolhost",
    ),
    ("probe", "unavailable"): (
        "probe-unavailable",
        "the sidecar's health probe reports this tool unavailable",
        "run `toolhost doctor` for the sidecar's reason",
    ),
    ("probe", "degraded"): (
        "probe-degraded",
        "the sidecar's health probe reports this tool degraded",
        "run `toolhost doctor` for the sidecar's reason",
    ),
    ("runtime", "starting"): (
        "starting",
        "the sidecar is starting: no worker has sent ready yet",
        "wait a moment; `toolhost status` shows its progress",
    ),
    ("runtime", "failed"): (
        "runtime-failed",
        "no worker of the sidecar can serve",
        "see `toolhost logs <sidecar>` for its stderr; it is retried with backoff",
    ),
    ("runtime", "timed-out"): (
        "start-timeout",
        "the sidecar did not become ready in time",
        "raise sidecars.<id>.probe.startTimeoutMs or fix its start-up",
    ),
    ("runtime", "schema-error"): (
        "schema-error",
        "the sidecar does not serve this tool or broke the protocol",
        "check that the sidecar's ready message lists the tool",
    ),
    ("sandbox", "denied"): (
        "sandbox-denied",
        "policy denies this tool",
        'change sidecars.<id>.sandbox to "allowed" or "approval-required"',
    ),
    ("sandbox", "quota-limited"): (
        "quota-limited",
        "a quota refuses calls to this tool for now",
        "wait for retryAfterMs or raise sidecars.<id>.quota",
    ),
    ("upgrade", "applying"): (
        "upgrade-applying",
        "a package upgrade is being applied",
        "wait for `toolhost pkg status` to show idle",
    ),
    ("upgrade", "rollback-required"): (
        "rollback-required",
        "the new package version failed its start or probe",
        "run `toolhost pkg rollback <id> --yes` or stage a fixed version",
    ),
    ("upgrade", "failed"): (
        "upgrade-failed",
        "the package upgrade failed",
        "see `toolhost pkg status` and stage the package again",
    ),
}

FIELDS = ("discovery", "manifest", "path", "version", "probe", "runtime", "sandbox", "upgrade")


def problems(f: Facts) -> list[tuple[str, str]]:
    """The (field, value) pairs that make ``f`` less than available, in field order."""
    out = []
    for name in FIELDS:
        value = getattr(f, name)
        if (name, value) in _GENERIC:
            out.append((name, value))
    return out


def generic_reason(field: str, value: str, sidecar: str | None = None) -> Reason:
    """The default reason for a problematic field value, with ``<id>`` filled in."""
    code, message, hint = _GENERIC[(field, value)]
    if sidecar:
        hint = hint.replace("<id>", sidecar).replace("<sidecar>", sidecar)
    return Reason(field=field, code=code, message=message, hint=hint)


def assess(
    f: Facts,
    specific: Mapping[str, Reason] | None = None,
    sidecar: str | None = None,
) -> tuple[Effective, list[Reason]]:
    """``effective`` and the reasons behind it.

    Args:
        f: The eight facts.
        specific: Better reasons for some fields (the sidecar's own message and hint).
        sidecar: Sidecar id used to fill generic hints.

    Returns:
        ``(effective, reasons)``; reasons are empty exactly when effective is ``available``.
    """
    eff = effective(f)
    if eff == "available":
        return eff, []
    reasons = []
    for name, value in problems(f):
        given = specific.get(name) if specific else None
        reasons.append(given if given is not None else generic_reason(name, value, sidecar))
    return eff, reasons
