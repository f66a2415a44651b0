"""The write-ahead journal of apply/rollback, and the upgrade records that outlive it.

# Strategy: a transaction is planned completely before it starts: the folder renames (relative
# to ``tools/packages``), the sha256 of the registry before and after. The plan is written (fsync,
# atomic rename) as ``tools/packages/.journal.json`` before the first rename, and ``done`` (how
# many renames are complete) is rewritten after each one. The registry swap is the commit point:
# recovery finds the journal and either undoes the renames in reverse (the registry still holds
# the old text) or finishes the bookkeeping (it holds the new text).
#
# A crash can fall between a rename and the journal update that counts it, so ``done`` may be one
# short (or, while undoing, one long). Which one is read off the disk, and only ever between two
# neighbouring states of the sequence, where exactly one rename differs: before it its source
# exists and its destination does not, after it the reverse. (Checking every rename on its own
# would be ambiguous: ``.previous/<id>`` is a destination in one step and a source in another.)
#
# ``.upgrades.json`` keeps what must survive the transaction: a version applied but not yet
# seen ready (``verifying``), and the operator decisions pending (``rollback-required``,
# ``failed``).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from pathlib import Path
from typing import Literal

import msgspec

from supervisor.packages.errors import PackageError
from supervisor.packages.fsio import atomic_write, durable_rename, fsync_dir

JOURNAL_NAME = ".journal.json"
UPGRADES_NAME = ".upgrades.json"

Op = Literal["apply", "rollback"]


class Move(msgspec.Struct, frozen=True, kw_only=True):
    """One folder rename, both paths relative to ``tools/packages``; ``step`` names it."""

    step: str
    src: str
    dst: str


class Journal(msgspec.Struct, kw_only=True):
    """The write-ahead record of one apply or rollback."""

    format: int = 1
    tx: str
    op: Op
    id: str
    fromVersion: str | None
    toVersion: str
    moves: list[Move]
    registryBefore: str
    """sha256 of the registry file before ("" when there was none)"""
    registryAfter: str
    """sha256 of the registry file the transaction commits"""
    done: int = 0
    """renames known complete (the next one may be complete too, see :func:`progress`)"""
    undoing: bool = False
    """recovery is reversing the renames (then ``done`` may be one too many)"""
    committed: bool = False
    autoRollback: bool = False


class UpgradeRecord(msgspec.Struct, kw_only=True, omit_defaults=True):
    """A package whose last apply or rollback still needs the host, or the operator."""

    state: Literal["verifying", "rollback-required", "failed"]
    op: Op
    toVersion: str
    fromVersion: str | None = None
    autoRollback: bool = False
    message: str = ""


class UpgradesFile(msgspec.Struct, kw_only=True):
    format: int = 1
    packages: dict[str, UpgradeRecord] = msgspec.field(default_factory=dict)


_journal_decoder = msgspec.json.Decoder(Journal)
_upgrades_decoder = msgspec.json.Decoder(UpgradesFile)


def sha256_file(path: Path) -> str:
    """sha256 hex of a file's bytes; "" when it does not exist."""
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except FileNotFoundError:
        return ""


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def read_journal(path: Path) -> Journal | None:
    """The unfinished transaction, if any.

    Raises:
        PackageError: ``io-failed`` when the journal exists but cannot be read (it is written
            atomically, so this means outside interference; it is left for the operator).
    """
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    try:
        return _journal_decoder.decode(data)
    except msgspec.DecodeError as exc:
        raise PackageError(
            "io-failed",
            f"{path.name} cannot be read ({exc}); inspect it and the package folders by hand",
        ) from exc


def write_journal(path: Path, journal: Journal) -> None:
    atomic_write(path, msgspec.json.format(msgspec.json.encode(journal)) + b"\n")


def remove_journal(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
        fsync_dir(path.parent)


def read_upgrades(path: Path) -> UpgradesFile:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return UpgradesFile()
    try:
        return _upgrades_decoder.decode(data)
    except msgspec.DecodeError as exc:
        raise PackageError(
            "io-failed", f"{path.name} cannot be read ({exc}); inspect it by hand"
        ) from exc


def write_upgrades(path: Path, upgrades: UpgradesFile) -> None:
    atomic_write(path, msgspec.json.format(msgspec.json.encode(upgrades)) + b"\n")


def _exists(p: Path) -> bool:
    return os.path.lexists(p)


def move_done(base: Path, move: Move) -> bool:
    """The rename happened: its destination exists and its source does not.

    Only meaningful between the two neighbouring states this one rename separates.
    """
    return _exists(base / move.dst) and not _exists(base / move.src)


def progress(base: Path, journal: Journal) -> int:
    """How many renames are complete on disk, from ``done`` and the one rename in doubt."""
    n = journal.done
    if journal.undoing:
        return n if n == 0 or move_done(base, journal.moves[n - 1]) else n - 1
    return n + 1 if n < len(journal.moves) and move_done(base, journal.moves[n]) else n


def undo_moves(base: Path, journal: Journal, path: Path) -> list[str]:
    """Reverse every complete rename, last first, counting down in the journal at ``path``."""
    journal.done = progress(base, journal)
    journal.undoing = True
    write_journal(path, journal)
    undone = []
    for i in reversed(range(journal.done)):
        move = journal.moves[i]
        durable_rename(base / move.dst, base / move.src)
        undone.append(move.step)
        journal.done = i
        write_journal(path, journal)
    return undone
