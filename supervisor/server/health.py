"""Liveness and readiness for process supervisors (systemd, Kubernetes probes).

# Strategy: one pure function of a ``system.health`` answer (or of its absence) backs
# ``toolhost health --live|--ready`` (exit code and one JSON line) and the HTTP ``/healthz`` and
# ``/readyz`` endpoints on the gateway port (and on ``toolhost mcp --http``):
#
# - live: the host answers ``system.health`` (its event loop runs).
# - ready: live, the registry is loaded (a running host has always read it), and every sidecar
#   whose entry says ``critical: true`` is ``available``.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from supervisor.contracts.rpc import HealthResult

Probe = Literal["live", "ready"]


def probe(kind: Probe, health: HealthResult | None, error: str = "") -> tuple[bool, dict[str, Any]]:
    """``(ok, body)`` for a probe; ``health`` is None when the host did not answer."""
    if health is None:
        return False, {"probe": kind, "ok": False, "live": False, "error": error or "no answer"}
    ok = True if kind == "live" else health.ready
    body: dict[str, Any] = {
        "probe": kind,
        "ok": ok,
        "live": True,
        "ready": health.ready,
        "status": health.status,
        "critical": health.critical,
        "tools": msgspec.to_builtins(health.tools),
    }
    if not health.ready:
        body["notReady"] = sorted(s for s, st in health.critical.items() if st != "available")
    return ok, body


def http_answer(path: str, health: HealthResult | None) -> tuple[int, bytes]:
    """``/healthz`` (live) or ``/readyz`` (ready) as (HTTP status, JSON body)."""
    ok, body = probe("ready" if path == "/readyz" else "live", health)
    return (200 if ok else 503), msgspec.json.encode(body) + b"\n"
