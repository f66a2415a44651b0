"""Per-tool retry (PROTOCOL 2): ``retry = {maxAttempts, backoffMs}`` from the tool's manifest.

Pure. A retry happens only for a ``readOnly`` tool (running it twice cannot do harm twice) and
only when the attempt failed because the worker died (``worker-crashed``): every other failure
is the tool's real answer. A call has one deadline, from the moment the host accepted it, that
covers its queue wait, every attempt and the ``backoffMs`` between them, so an attempt that ran
out of time (``timeout``) leaves nothing for another, and a retry that could not start before
the deadline is not tried.
"""

from __future__ import annotations

from supervisor.contracts.manifest import ToolManifest

RETRYABLE_CODES = frozenset(("worker-crashed",))


def max_attempts(manifest: ToolManifest | None) -> int:
    """How many attempts a call of this tool may take (1 = no retry)."""
    if manifest is None or manifest.retry is None or not manifest.read_only:
        return 1
    return max(1, manifest.retry.max_attempts)


def retry_delay_ms(manifest: ToolManifest | None, code: str | None, attempt: int) -> int | None:
    """The wait before attempt ``attempt + 1``, or None when the call must not be retried.

    Args:
        manifest: The tool's manifest (None: unknown to the catalog, never retried).
        code: The failure code of attempt ``attempt`` (None: it succeeded).
        attempt: The attempt that just ended (1-based).
    """
    if code not in RETRYABLE_CODES or attempt >= max_attempts(manifest):
        return None
    assert manifest is not None and manifest.retry is not None
    return max(0, manifest.retry.backoff_ms)
