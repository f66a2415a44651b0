"""Durable sidecar state (PROTOCOL 3.5 ``state.*``): one embedded SQLite database per app root.

# Strategy: ``<appRoot>/.toolhost/state.db``, mode 0600, never a symlink, WAL. Reads (``get``,
# ``list``) run on the caller's thread on a read connection: a primary-key lookup is a few
# microseconds, cheaper than any hand-off. Writes go to one writer thread that owns the only
# write connection (``synchronous=FULL``: a ``set`` that was answered survives a power cut, a
# host crash or ``kill -9``); the host queues them and the writer commits everything that queued
# meanwhile in one transaction, so many concurrent writers cost one fsync per batch, not one
# each.
# Compare-and-set (``ifValue`` / ``ifAbsent``) is checked inside that transaction, so concurrent
# read-modify-write loops from several workers lose nothing.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from collections.abc import Iterable
from typing import Any

import msgspec

from supervisor.private_files import open_private

SCHEMA = """
CREATE TABLE IF NOT EXISTS state (
    ns    TEXT NOT NULL,
    key   TEXT NOT NULL,
    value BLOB NOT NULL,
    PRIMARY KEY (ns, key)
) WITHOUT ROWID
"""

ABSENT = object()
"""``expect`` of a write that must find no value (``ifAbsent``)."""
ANY = object()
"""``expect`` of an unconditional write."""


class StateError(Exception):
    """A store that cannot be opened or used (the message says why)."""


class Write(msgspec.Struct):
    """One queued write: ``value`` None deletes."""

    ns: str
    key: str
    value: bytes | None
    expect: Any = ANY
    """ANY, ABSENT, or the decoded value that must be stored now (compare-and-set)."""


def ensure_private_file(path: str, *, create: bool = True) -> None:
    """Create ``path`` 0600 (its folder 0700) or check an existing one: a regular file of the
    host's user, never a symlink, tightened to 0600 (private_files.py).

    Raises:
        OSError: It is a symlink, another user's or not a regular file, or cannot be opened.
    """
    os.close(open_private(path, os.O_RDWR, create=create))


class StateStore:
    """The database behind ``state.*`` and ``toolhost state``.

    Args:
        path: The database file (created 0600; an existing one is tightened to 0600).
    """

    def __init__(self, path: str) -> None:
        self.path = path
        try:
            ensure_private_file(path)
            for suffix in ("-wal", "-shm"):  # before SQLite opens them
                with contextlib.suppress(FileNotFoundError):
                    ensure_private_file(path + suffix, create=False)
            self._read = self._connect()
            self._read.execute(SCHEMA)
        except (OSError, sqlite3.Error) as exc:
            raise StateError(f"cannot open the state database {path}: {exc}") from exc
        self._write: sqlite3.Connection | None = None

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute("PRAGMA busy_timeout=5000")
        return conn

    # reads (any thread) -------------------------------------------------------------------

    def get(self, ns: str, key: str) -> bytes | None:
        row = self._read.execute(
            "SELECT value FROM state WHERE ns = ? AND key = ?", (ns, key)
        ).fetchone()
        return bytes(row[0]) if row is not None else None

    def keys(self, ns: str, prefix: str = "") -> list[str]:
        if prefix:
            rows = self._read.execute(
                "SELECT key FROM state WHERE ns = ? AND substr(key, 1, ?) = ? ORDER BY key",
                (ns, len(prefix), prefix),
            )
        else:
            rows = self._read.execute("SELECT key FROM state WHERE ns = ? ORDER BY key", (ns,))
        return [r[0] for r in rows]

    def namespaces(self) -> list[tuple[str, int]]:
        """Every namespace and how many keys it holds (``toolhost state list``)."""
        rows = self._read.execute("SELECT ns, count(*) FROM state GROUP BY ns ORDER BY ns")
        return [(r[0], r[1]) for r in rows]

    # writes (the writer thread only) ------------------------------------------------------

    def apply(self, writes: Iterable[Write]) -> list[str | None]:
        """Commit ``writes`` in one transaction; returns, per write, None or why it was refused
        (``conflict``: the compare-and-set did not match)."""
        if self._write is None:
            self._write = self._connect()
        conn = self._write
        out: list[str | None] = []
        conn.execute("BEGIN IMMEDIATE")
        try:
            for w in writes:
                if w.expect is not ANY:
                    row = conn.execute(
                        "SELECT value FROM state WHERE ns = ? AND key = ?", (w.ns, w.key)
                    ).fetchone()
                    if w.expect is ABSENT:
                        ok = row is None
                    else:
                        ok = row is not None and msgspec.json.decode(bytes(row[0])) == w.expect
                    if not ok:
                        out.append("conflict")
                        continue
                if w.value is None:
                    conn.execute("DELETE FROM state WHERE ns = ? AND key = ?", (w.ns, w.key))
                else:
                    conn.execute(
                        "INSERT INTO state (ns, key, value) VALUES (?, ?, ?) "
                        "ON CONFLICT (ns, key) DO UPDATE SET value = excluded.value",
                        (w.ns, w.key, w.value),
                    )
                out.append(None)
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        return out

    def close(self) -> None:
        self._read.close()
        if self._write is not None:
            self._write.close()
