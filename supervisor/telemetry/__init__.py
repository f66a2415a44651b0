"""Telemetry: OpenTelemetry traces and metrics, and JSON logs (docs/telemetry.md).

# Strategy: this package is the one place that knows OpenTelemetry, and only
# :mod:`supervisor.telemetry.tracing` and :mod:`supervisor.telemetry.metering` import it, lazily,
# from :func:`start`. The call path holds ``None`` where telemetry is off or not installed and
# tests one attribute per hook (``invoker.telemetry``, ``call.trace``), so an untraced call does
# no telemetry work. Everything the SDK exports leaves on the SDK's own threads (the batch span
# processor, the periodic metric reader): a collector that is down or hangs costs a log line on
# those threads, never latency on the Trio loop.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from supervisor.telemetry.tracing import Tracing

log = logging.getLogger("toolhost.telemetry")

OTEL_ENV_PREFIX = "OTEL_"


def disabled_by_env(environ: dict[str, str] | None = None) -> bool:
    """``OTEL_SDK_DISABLED=true`` switches telemetry off whatever the registry says."""
    env = os.environ if environ is None else environ
    return env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true"


def installed() -> bool:
    """Whether the ``toolhost[otel]`` extra (SDK and OTLP/HTTP exporter) can be imported."""
    try:
        import opentelemetry.exporter.otlp.proto.http
        import opentelemetry.sdk.trace  # noqa: F401
    except ImportError:
        return False
    return True


def start(
    enabled: bool,
    *,
    capture_content: bool = False,
    redact: Callable[[str], str] = lambda text: text,
    queue_depth: Callable[[], Iterable[tuple[str, int]]] = lambda: (),
) -> Tracing | None:
    """Start tracing and metrics when ``host.telemetry.enabled`` asks for them.

    Returns None (and the call path does nothing) when telemetry is off, disabled by
    ``OTEL_SDK_DISABLED`` or the ``otel`` extra is not installed (logged once).

    Args:
        enabled: ``host.telemetry.enabled``.
        capture_content: ``host.telemetry.captureContent``: inputs and outputs as span
            attributes (vault values redacted).
        redact: Masks vault values out of captured content (the host's redactor).
        queue_depth: ``(sidecar, calls queued)`` of every pool, for the queue-depth gauge.
    """
    if not enabled:
        return None
    if disabled_by_env():
        log.info("telemetry: off (OTEL_SDK_DISABLED=true)")
        return None
    if not installed():
        log.warning(
            "telemetry: host.telemetry.enabled is set but OpenTelemetry is not installed "
            "(pip install 'toolhost[otel]'); running without it"
        )
        return None
    from supervisor.telemetry.tracing import Tracing

    exporter_log = logging.getLogger("opentelemetry.exporter")
    if exporter_log.level == logging.NOTSET:
        # A collector that is down: one error line per failed batch, not a warning per retry.
        exporter_log.setLevel(logging.ERROR)
    tracing = Tracing.from_env(
        capture_content=capture_content, redact=redact, queue_depth=queue_depth
    )
    log.info("telemetry: exporting traces and metrics over OTLP/HTTP (%s)", tracing.endpoint)
    return tracing


def sidecar_env(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The ``OTEL_*`` settings a sidecar inherits when telemetry is on, so the SDK in it can
    export its own spans to the same collector (PROTOCOL 3's allow-list plus these)."""
    env = os.environ if environ is None else environ
    out = {k: v for k, v in env.items() if k.startswith(OTEL_ENV_PREFIX)}
    out.pop("OTEL_SERVICE_NAME", None)
    out["TOOLHOST_TELEMETRY"] = "1"
    return out
