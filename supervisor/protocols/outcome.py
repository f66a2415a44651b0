"""How one attempt of a call ended, in the host's terms, whatever protocol carried it.

# Strategy: a result has one shape from the parser that reads it to the step that makes the
# envelope. Every protocol parser ends in a :class:`CallOutcome` (process-json's ``result``
# message, a oneshot line, a simple-json or CLI script's stdout, an MCP ``tools/call`` answer),
# and so does every failure the host makes up (a worker that died, a deadline, a refusal). What
# only the runtime knows (the pid, the exit status and stderr tail of a per-call process) is
# filled in on that same object by the worker before it hands it to the call; the result funnel
# (:mod:`supervisor.policy.results`) turns it into the envelope, the one change of shape. The
# helpers below are the wording every parser shares (an exit status, a quote of some output).
"""

from __future__ import annotations

import signal
from typing import Any

import msgspec

from supervisor.contracts.wire import NULL

PREVIEW_BYTES = 200


class CallOutcome(msgspec.Struct, kw_only=True):
    """One attempt's end: ``ok`` with data and text, or a failure code with a message, and
    what the runtime knows of the process that answered."""

    ok: bool
    data: msgspec.Raw = NULL
    content: str | None = None
    code: str | None = None
    error: str | None = None
    details: dict[str, Any] | None = None
    cpu_ms: float | None = None
    """CPU time the sidecar reported for the call (process-json ``cpuMs``)."""
    exit_code: int | None = None
    """A failed per-call process's exit status."""
    stderr: str | None = None
    """A failed process's stderr tail."""
    pid: int | None = None
    """The process that answered."""


def describe_status(rc: int | None) -> str:
    """``exit status 3`` / ``killed by SIGKILL`` / ``still running``."""
    if rc is None:
        return "still running"
    if rc < 0:
        try:
            return f"killed by {signal.Signals(-rc).name}"
        except ValueError:
            return f"killed by signal {-rc}"
    return f"exit status {rc}"


def preview(data: bytes, limit: int = PREVIEW_BYTES) -> str:
    """A short, printable quote of some output for an error message."""
    text = data[:limit].decode("utf-8", "replace").strip()
    return repr(text + ("..." if len(data) > limit else ""))


def raw_json(value: Any) -> msgspec.Raw:
    """``value`` as raw JSON (``null`` for None)."""
    if value is None:
        return NULL
    return msgspec.Raw(msgspec.json.encode(value))
