"""Structured logs: one JSON object per line on stderr, and sidecar stderr forwarded as records.

# Strategy: ``host.logFormat: "json"`` (or ``toolhost serve --log-format json``) swaps the
# formatter of the root handler ``toolhost serve`` installs for :class:`JsonFormatter`; nothing
# else in the host changes how it logs. Known context rides on the record (``extra=``): sidecar,
# tool, callId, pid, trace_id, span_id. Sidecar stderr is drained by the workers into their
# rings anyway; with JSON logs a :class:`StderrLines` tap on each ring cuts the bytes into lines
# and logs each as a record tagged with sidecar and pid, through a token bucket per sidecar so a
# flooding sidecar costs a bounded number of records and one summary of what was dropped.
# Every message passes the host's redactor (vault values handed to sidecars become ``***``).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

FIELDS = (
    "sidecar",
    "tool",
    "callId",
    "pid",
    "trace_id",
    "span_id",
    "stream",
    "dropped",
    "truncated",
)
"""Record attributes copied into the JSON object when set (``logger.info(..., extra={...})``)."""

SIDECAR_LOGGER = "toolhost.sidecar"
MAX_LINE = 8192
"""A longer stderr line is cut (the ring keeps the bytes; the record says ``truncated``)."""
LINES_PER_SECOND = 50.0
BURST = 200


class JsonFormatter(logging.Formatter):
    """One JSON object per record: ``time``, ``level``, ``logger``, ``message`` and the known
    context fields; ``exception`` when the record carries one."""

    def __init__(self, redact: Callable[[str], str] | None = None) -> None:
        super().__init__()
        self.redact: Callable[[str], str] = redact or (lambda s: s)

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": self.redact(record.getMessage()),
        }
        for name in FIELDS:
            value = record.__dict__.get(name)
            if value is not None:
                out[name] = value
        if record.exc_info:
            out["exception"] = self.redact(self.formatException(record.exc_info))
        return json.dumps(out, ensure_ascii=False, default=str)


def configure(log_format: str, redact: Callable[[str], str] | None = None) -> JsonFormatter | None:
    """Use ``log_format`` (``text`` | ``json``) on the root logger's handlers; returns the JSON
    formatter (its ``redact`` may be set later, once the host's redactor exists)."""
    if log_format != "json":
        return None
    formatter = JsonFormatter(redact)
    root = logging.getLogger()
    if not root.handlers:
        logging.basicConfig()
    for handler in root.handlers:
        handler.setFormatter(formatter)
    return formatter


class _Bucket:
    """Lines one sidecar may still log now, and how many it lost."""

    __slots__ = ("dropped", "stamp", "tokens")

    def __init__(self) -> None:
        self.tokens = float(BURST)
        self.stamp = time.monotonic()
        self.dropped = 0


class StderrLines:
    """Forwards sidecar stderr lines as log records, rate-limited per sidecar.

    Args:
        rate: Lines per second a sidecar may log (after a burst of ``burst``).
        burst: Lines logged at once before the rate applies.
    """

    def __init__(self, rate: float = LINES_PER_SECOND, burst: int = BURST) -> None:
        self.rate = rate
        self.burst = burst
        self.log = logging.getLogger(SIDECAR_LOGGER)
        self._buckets: dict[str, _Bucket] = {}

    def tap(self, sidecar: str, context: Callable[[], dict[str, Any]]) -> Callable[[bytes], None]:
        """A callable for a worker's stderr ring: bytes in, one record per complete line.

        ``context()`` gives the fields known now (``pid``; with one call running on the
        worker, its ``tool``, ``callId`` and, when traced, ``trace_id`` and ``span_id``).
        """
        pending = bytearray()

        def feed(data: bytes) -> None:
            pending.extend(data)
            if b"\n" not in data:
                if len(pending) > MAX_LINE:
                    self.line(sidecar, context(), bytes(pending[:MAX_LINE]), truncated=True)
                    pending.clear()
                return
            *lines, rest = pending.split(b"\n")
            pending[:] = rest[:MAX_LINE]
            fields = context()
            for line in lines:
                cut = len(line) > MAX_LINE
                self.line(sidecar, fields, bytes(line[:MAX_LINE]), truncated=cut)

        return feed

    def line(
        self, sidecar: str, fields: dict[str, Any], line: bytes, truncated: bool = False
    ) -> None:
        """Log one stderr line of ``sidecar`` with ``fields`` (or count it as dropped)."""
        text = line.decode("utf-8", "replace").rstrip("\r")
        if not text.strip():
            return
        bucket = self._buckets.get(sidecar)
        if bucket is None:
            bucket = self._buckets[sidecar] = _Bucket()
        now = time.monotonic()
        bucket.tokens = min(float(self.burst), bucket.tokens + (now - bucket.stamp) * self.rate)
        bucket.stamp = now
        if bucket.tokens < 1.0:
            bucket.dropped += 1
            return
        bucket.tokens -= 1.0
        if bucket.dropped:
            dropped, bucket.dropped = bucket.dropped, 0
            self.log.warning(
                "%d stderr line(s) of %s dropped (over %g lines/s)",
                dropped,
                sidecar,
                self.rate,
                extra={"sidecar": sidecar, "dropped": dropped, "stream": "stderr"},
            )
        extra: dict[str, Any] = {**fields, "sidecar": sidecar, "stream": "stderr"}
        if truncated:
            extra["truncated"] = True
        self.log.info("%s", text, extra=extra)
