"""The audit log: one JSON line per invocation in ``host.auditLog``, rotated by size.

# Strategy: the invoke path only appends a small record to an in-memory queue (no disk I/O, no
# hashing there); a writer task computes the input digest, encodes whole lines and appends each
# batch with one ``write`` on an ``O_APPEND`` descriptor, so a crash can tear at most the last
# line. A batch is written at most :data:`FLUSH_DELAY_S` after its first record, or once
# :data:`FLUSH_BATCH` records wait - so a crash of the host loses at most that window's records:
# by the tick of a record that finds it full or half that window old (after that tick's answers
# are written, :func:`~supervisor.processes.direct_write.after_flush`), else by the writer task
# at the window's end, whose sleep's deadline a record only moves (nothing is woken until it is
# due). A busy host writes its audit with no wake-up of its own; an idle one's last batch waits
# for the writer. When the
# file passes ``host.auditMaxBytes`` it is rotated to ``.1``,
# ``.2``, ... keeping ``host.auditKeep`` old files. Before each batch the open descriptor is
# compared (``st_dev``/``st_ino``) with what the path names now (``lstat``): a file deleted or
# replaced under the host (by a tool, by hand) is noticed, reopened (never through a symlink) and
# the new file starts with an ``audit-reopened`` line saying why. Host events (a token changed)
# are lines with an ``event`` field instead of a ``tool``.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import logging
import os
import time
from collections import deque

import msgspec
import trio
import trio.lowlevel

from supervisor.private_files import open_private
from supervisor.processes.direct_write import after_flush

log = logging.getLogger("toolhost.audit")

FLUSH_DELAY_S = 0.02
FLUSH_BATCH = 256


class AuditApproval(msgspec.Struct, kw_only=True):
    granted: bool
    by: str


class AuditRecord(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One line of the audit log."""

    time: str
    client: str
    tool: str
    inputDigest: str
    inputBytes: int
    status: str
    errorCode: str | None = None
    durationMs: float = 0.0
    sidecar: str | None = None
    pid: int | None = None
    attempts: int = 1
    approval: AuditApproval | None = None
    callId: int | None = None
    via: str | None = None
    """``<parent tool>#<callId>`` on a child call made by a composite tool (PROTOCOL 3.5)."""
    children: list[str] | None = None
    """``<tool>#<callId>`` of every child call this call made."""
    requests: int = 0
    """Host-service requests the call's worker made for it."""


class AuditEvent(msgspec.Struct, kw_only=True, omit_defaults=True):
    """A line about the host itself, not a call: ``audit-reopened``, ``token-changed``."""

    time: str
    event: str
    reason: str | None = None
    token: str | None = None
    path: str | None = None


class AuditLinks(msgspec.Struct, kw_only=True):
    """What links a call to others (only composite calls and their children have them)."""

    call_id: int
    via: str | None = None
    children: list[str] | None = None
    requests: int = 0


class _Pending(msgspec.Struct):
    when: float
    client: str
    tool: str
    input: bytes
    status: str
    error_code: str | None
    duration_ms: float
    sidecar: str | None
    pid: int | None
    attempts: int
    approval: AuditApproval | None
    links: AuditLinks | None


class AuditLog:
    """Appends audit records from a background task.

    Args:
        path: The log file (its folder is created 0700 when missing).
        max_bytes: Rotate when the file would grow past this (0: never).
        keep: Rotated files to keep.
    """

    def __init__(self, path: str, *, max_bytes: int = 10 * 1024 * 1024, keep: int = 3) -> None:
        self.path = path
        self.max_bytes = max_bytes
        self.keep = keep
        self._queue: deque[_Pending | AuditEvent | dict[str, object]] = deque()
        self._due = float("inf")
        """When the writer writes next (trio time; inf: nothing queued)."""
        self._sleep: trio.CancelScope | None = None
        """The writer's sleep until :attr:`_due` (None while it writes)."""
        self._fd: int | None = None
        self._size = 0
        self.written = 0
        self.failed: str | None = None
        self._encoder = msgspec.json.Encoder()
        self._sec = -1
        self._sec_text = ""
        self._written_by_tick = False
        """A batch is due and the current tick writes it (:func:`after_flush`)."""
        self._lost: str | None = None
        """Why the file the host had open is no longer at ``path`` (until a reopen succeeds)."""

    def record(
        self,
        *,
        client: str,
        tool: str,
        input_json: bytes,
        status: str,
        error_code: str | None,
        duration_ms: float,
        sidecar: str | None,
        pid: int | None,
        attempts: int,
        approval: AuditApproval | None,
        links: AuditLinks | None = None,
    ) -> None:
        """Queue one record (cheap; called on the invoke path)."""
        self._queue.append(
            _Pending(
                time.time(),
                client,
                tool,
                input_json,
                status,
                error_code,
                duration_ms,
                sidecar,
                pid,
                attempts,
                approval,
                links,
            )
        )
        queued = len(self._queue)
        if queued == 1:
            self._arm(FLUSH_DELAY_S)
        elif not self._written_by_tick and (queued >= FLUSH_BATCH or self._past_due()):
            # Due (or full) while calls go on: this tick writes the batch once its answers are
            # out, where the writer would wake for it; a busy host writes its audit without a
            # wake-up of its own. The writer still wakes for the last batch when calls stop.
            self._written_by_tick = True
            after_flush(self._flush_due)

    def _past_due(self) -> bool:
        """The batch is half its window old: a record now writes it, before the writer's
        deadline (a record arriving after it would find the writer woken already)."""
        try:
            return trio.current_time() >= self._due - FLUSH_DELAY_S / 2
        except RuntimeError:  # outside the host's loop: the writer's first pass writes it
            return False

    def _flush_due(self) -> None:
        self._written_by_tick = False
        self.flush()
        self._due = float("inf")  # nothing queued: the next record arms the writer again
        if self._sleep is not None:
            self._sleep.deadline = self._due

    def event(
        self,
        event: str,
        *,
        reason: str | None = None,
        token: str | None = None,
        path: str | None = None,
    ) -> None:
        """Queue a line about the host itself (``token-changed``, ...)."""
        when = self._timestamp(time.time())
        self._queue.append(
            AuditEvent(time=when, event=event, reason=reason, token=token, path=path)
        )
        if len(self._queue) == 1:
            self._arm(FLUSH_DELAY_S)

    def line(self, record: msgspec.Struct) -> None:
        """Queue a line that is not a call (an ``egress`` record of the proxy, PROTOCOL 7),
        stamped with the time."""
        fields = msgspec.to_builtins(record)
        assert isinstance(fields, dict)
        self._queue.append({"time": self._timestamp(time.time()), **fields})
        if len(self._queue) == 1:
            self._arm(FLUSH_DELAY_S)

    def open(self) -> None:
        """Open (or create) the file now, so a bad one stops the host at start.

        Raises:
            OSError: It is a symlink, another user's, not a regular file, or cannot be opened.
        """
        self._open()

    def _arm(self, delay_s: float) -> None:
        """Have the writer write at most ``delay_s`` from now: its sleep's deadline moves, which
        wakes nothing now (one wake-up per batch, when it is due)."""
        try:
            due = trio.current_time() + delay_s
        except RuntimeError:  # outside the host's loop (before it runs): at its first pass
            due = float("-inf")
        if due < self._due:
            self._due = due
            if self._sleep is not None:
                self._sleep.deadline = due

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Write queued records until cancelled; flushes what is queued on the way out."""
        task_status.started()
        try:
            while True:
                with trio.CancelScope(deadline=self._due) as self._sleep:
                    await trio.sleep_forever()
                self._sleep = None
                self._due = float("inf")
                self.flush()
        finally:
            self._sleep = None
            self.flush()
            if self._fd is not None:
                with contextlib.suppress(OSError):
                    os.close(self._fd)
                self._fd = None

    def flush(self) -> None:
        """Write everything queued now (synchronously)."""
        if not self._queue:
            return
        items = list(self._queue)
        self._queue.clear()
        lines = b"".join(
            self._encode(p) if isinstance(p, _Pending) else self._encoder.encode(p) + b"\n"
            for p in items
        )
        try:
            fd = self._open_current()
            if self.max_bytes and self._size and self._size + len(lines) > self.max_bytes:
                self._rotate()
                fd = self._open()
            os.write(fd, lines)
            self._size += len(lines)
            self.written += len(items)
            self.failed = None
        except OSError as exc:
            if self.failed is None:
                log.error("audit log %s: cannot write: %s", self.path, exc)
            self.failed = str(exc)

    def _encode(self, p: _Pending) -> bytes:
        rec = AuditRecord(
            time=self._timestamp(p.when),
            client=p.client,
            tool=p.tool,
            inputDigest="sha256:" + hashlib.sha256(p.input).hexdigest(),
            inputBytes=len(p.input),
            status=p.status,
            errorCode=p.error_code,
            durationMs=p.duration_ms,
            sidecar=p.sidecar,
            pid=p.pid,
            attempts=p.attempts,
            approval=p.approval,
        )
        links = p.links
        if links is not None:
            rec.callId, rec.via, rec.children = links.call_id, links.via, links.children
            rec.requests = links.requests
        return self._encoder.encode(rec) + b"\n"

    def _timestamp(self, when: float) -> str:
        """ISO 8601 UTC with milliseconds; the per-second part is formatted once a second."""
        sec = int(when)
        if sec != self._sec:
            self._sec = sec
            self._sec_text = dt.datetime.fromtimestamp(sec, dt.UTC).strftime("%Y-%m-%dT%H:%M:%S")
        return f"{self._sec_text}.{int((when - sec) * 1000):03d}+00:00"

    def _open_current(self) -> int:
        """The descriptor of the file at ``path`` now: reopened (with an ``audit-reopened`` line
        first) when the one the host had was deleted or replaced."""
        if self._fd is not None and self._lost is None:
            self._lost = self._gone(self._fd)
            if self._lost is not None:
                log.error("audit log %s was %s under the host; reopening it", self.path, self._lost)
                with contextlib.suppress(OSError):
                    os.close(self._fd)
                self._fd = None
        fd = self._open()
        if self._lost is not None:
            note = AuditEvent(
                time=self._timestamp(time.time()),
                event="audit-reopened",
                reason=self._lost,
                path=self.path,
            )
            line = self._encoder.encode(note) + b"\n"
            os.write(fd, line)
            self._size += len(line)
            self._lost = None
        return fd

    def _gone(self, fd: int) -> str | None:
        """``deleted`` or ``replaced`` when ``path`` no longer names the open file, else None."""
        try:
            now = os.lstat(self.path)
        except FileNotFoundError:
            return "deleted"
        held = os.fstat(fd)
        if (now.st_dev, now.st_ino) != (held.st_dev, held.st_ino):
            return "replaced"
        return None

    def _open(self) -> int:
        if self._fd is None:
            # 0600, never through a symlink; an existing 0644 file is tightened
            # (private_files.py).
            self._fd = open_private(self.path, os.O_WRONLY | os.O_APPEND)
            self._size = os.fstat(self._fd).st_size
        return self._fd

    def _rotate(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        for i in range(self.keep - 1, 0, -1):
            src = f"{self.path}.{i}"
            if os.path.exists(src):
                os.replace(src, f"{self.path}.{i + 1}")
        if self.keep > 0:
            os.replace(self.path, f"{self.path}.1")
        else:
            os.unlink(self.path)
        self._size = 0
