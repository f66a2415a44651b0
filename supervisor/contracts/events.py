"""Operator events (PROTOCOL 6 ``events.subscribe``): the params and each event's data.

A subscriber names the topics it wants (``workers``, ``calls``, ``logs``) and optionally one
sidecar; it then gets ``worker.changed``, ``call.started``/``call.ended`` and ``log.line`` events,
and ``events.dropped {count}`` where it did not keep up. Fields beyond PROTOCOL 6 (``message``,
``stderr`` and ``pid`` of an ended call) are additive.
"""

from __future__ import annotations

from typing import Literal

from msgspec import Struct

from supervisor.contracts.snapshot import WorkerStatus

Topic = Literal["workers", "calls", "logs"]
TOPICS: tuple[Topic, ...] = ("workers", "calls", "logs")


class SubscribeParams(Struct, kw_only=True, forbid_unknown_fields=True):
    """``events.subscribe`` params."""

    topics: list[Topic]
    sidecar: str | None = None


class WorkerChanged(Struct, kw_only=True, omit_defaults=True):
    """``worker.changed``: a worker started, became ready, changed state or exited."""

    sidecar: str
    worker: WorkerStatus


class CallStarted(Struct, kw_only=True, omit_defaults=True):
    """``call.started``: a call passed the gate and went to its pool."""

    callId: int
    tool: str
    sidecar: str
    requestId: int | str | None = None


class CallEnded(Struct, kw_only=True, omit_defaults=True):
    """``call.ended``: the call's one envelope was made."""

    callId: int
    tool: str
    sidecar: str
    status: str
    durationMs: float
    code: str | None = None
    message: str | None = None
    """For a failed or unavailable call: the error message (cut at 1 KiB)."""
    stderr: str | None = None
    """For a failed call: the stderr tail the envelope carries (the last 1 KiB)."""
    pid: int | None = None


class LogLine(Struct, kw_only=True):
    """``log.line``: one line a sidecar wrote to stderr (secrets redacted, cut at 2 KiB)."""

    sidecar: str
    pid: int | None
    stream: Literal["stderr"] = "stderr"
    line: str


class EventsDropped(Struct, kw_only=True):
    """``events.dropped``: this many events were lost because the subscriber fell behind."""

    count: int
