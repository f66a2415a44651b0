"""The external tool package manager: stage, apply, roll back, recover, report.

# Strategy: the file system under ``tools/packages`` plus the registry *is* the state; this
# class reads it, plans a change completely (a :class:`Transaction`), and executes the plan
# through the journal (see ``journal.py``). Nothing here runs a sidecar or imports payload code:
# the host restarts and verifies sidecars (``supervisor/host/upgrades.py``) and reports the
# verdict back with :meth:`PackageManager.settle_verification`. Every public operation expects
# the caller to hold :attr:`PackageManager.lock` (the CLI for one command, the host for one
# operation), which the kernel releases if the holder dies.
#
# Layout (all relative to the app root; no absolute path is ever written to any file):
#   tools/external.tools.jsonc        the registry; a sidecar entry per installed package
#   tools/external.tools.jsonc.next   the registry as it will be once what is staged is applied
#   tools/packages/<id>/              the installed package
#   tools/packages/.staging/<id>@<v>/ a staged version (one per package)
#   tools/packages/.previous/<id>/    the version before the last apply or rollback
#   tools/packages/.journal.json      an apply or rollback in progress (write-ahead)
#   tools/packages/.upgrades.json     versions awaiting verification or an operator decision
#   tools/packages/.lock              held for the duration of an operation
"""

from __future__ import annotations

import os
import re
import signal
import sys
import uuid
from pathlib import Path
from typing import Any

import json5
import msgspec

import supervisor
from supervisor.contracts.packages import (
    PACKAGE_ID_PATTERN,
    PackageFile,
    PackageInfo,
    PackagesStatus,
    StageResult,
    TransactionInfo,
)
from supervisor.contracts.snapshot import Reason, UpgradeField
from supervisor.packages import format as fmt
from supervisor.packages.errors import PackageError
from supervisor.packages.fsio import (
    FileLock,
    atomic_write,
    copy_tree,
    durable_rename,
    make_dirs,
    remove_tree,
)
from supervisor.packages.journal import (
    JOURNAL_NAME,
    UPGRADES_NAME,
    Journal,
    Move,
    UpgradeRecord,
    read_journal,
    read_upgrades,
    remove_journal,
    sha256_file,
    sha256_text,
    undo_moves,
    write_journal,
    write_upgrades,
)
from supervisor.packages.jsonc import set_sidecar
from supervisor.packages.states import Verdict, derive_upgrade, settle, upgrade_reason
from supervisor.registry.load import REGISTRY_RELPATH, jsonc_error, validate_entry

PACKAGES_RELPATH = "tools/packages"
CRASH_ENV = "TOOLHOST_PKG_CRASH_AT"
HOOKS_ENV = "TOOLHOST_TEST_HOOKS"

APPLY_STEPS = (
    "journal-written",
    "previous-trashed",
    "current-moved",
    "staged-moved",
    "next-written",
    "registry-swapped",
    "journal-committed",
    "state-written",
    "cleaned",
)
ROLLBACK_STEPS = (
    "journal-written",
    "current-set-aside",
    "previous-restored",
    "current-kept-as-previous",
    "next-written",
    "registry-swapped",
    "journal-committed",
    "state-written",
    "cleaned",
)
STAGE_STEPS = ("copied", "renamed")


def crash_point(name: str) -> None:
    """Test hook: stop this process at step ``name`` (``apply:staged-moved``) so a test can
    SIGKILL it there. Active only with ``TOOLHOST_TEST_HOOKS=1`` and ``TOOLHOST_PKG_CRASH_AT``
    naming the step; a no-op otherwise."""
    if os.environ.get(HOOKS_ENV) != "1" or os.environ.get(CRASH_ENV) != name:
        return
    sys.stderr.write(f"toolhost: crash point {name}\n")
    sys.stderr.flush()
    os.kill(os.getpid(), signal.SIGSTOP)


class Transaction(msgspec.Struct, kw_only=True):
    """A planned apply or rollback: the journal to write and the registry text it commits."""

    journal: Journal
    registry_text: str


class PackageManager:
    """Package operations on one app root.

    Args:
        app_root: The application root.
        registry_path: The project registry (default ``<app_root>/tools/external.tools.jsonc``).
        host_version: The toolhost version ``compatibleCore`` is checked against.
    """

    def __init__(
        self,
        app_root: str | os.PathLike[str],
        *,
        registry_path: str | os.PathLike[str] | None = None,
        host_version: str = supervisor.__version__,
    ) -> None:
        self.app_root = Path(os.path.abspath(app_root))
        reg = Path(registry_path) if registry_path else Path(REGISTRY_RELPATH)
        self.registry = reg if reg.is_absolute() else self.app_root / reg
        self.next = self.registry.with_name(self.registry.name + ".next")
        self.base = self.app_root / PACKAGES_RELPATH
        self.staging = self.base / ".staging"
        self.previous = self.base / ".previous"
        self.trash = self.base / ".trash"
        self.journal_path = self.base / JOURNAL_NAME
        self.upgrades_path = self.base / UPGRADES_NAME
        self.lock = FileLock(self.base / ".lock")
        self.host_version = host_version

    # reading -------------------------------------------------------------------------------

    def exists(self) -> bool:
        """Whether there is anything to manage (``tools/packages`` exists)."""
        return self.base.is_dir()

    def _rel(self, path: Path) -> str:
        return os.path.relpath(path, self.app_root)

    def _dirs(self, folder: Path) -> list[str]:
        try:
            return sorted(e.name for e in os.scandir(folder) if not e.name.startswith("."))
        except FileNotFoundError:
            return []

    def installed_ids(self) -> list[str]:
        """Folders under ``tools/packages`` holding a ``package.toml`` (others are unmanaged)."""
        return [i for i in self._dirs(self.base) if (self.base / i / fmt.PACKAGE_FILE).is_file()]

    def staged(self) -> dict[str, str]:
        """Package id -> staged folder name (``<id>@<version>``)."""
        out: dict[str, str] = {}
        for name in self._dirs(self.staging):
            pid, sep, _ = name.partition("@")
            if sep:
                out[pid] = name
        return out

    def _read(self, folder: Path) -> PackageFile | None:
        try:
            return fmt.read_package(folder)
        except PackageError:
            return None

    def _version_of(self, folder: Path) -> str | None:
        pkg = self._read(folder)
        return pkg.version if pkg else None

    def installed(self, pid: str) -> PackageFile | None:
        """The installed package, None when there is none.

        Raises:
            PackageError: ``conflict`` when ``tools/packages/<pid>`` exists but is not a
                package the manager can read (it is never moved or overwritten).
        """
        folder = self.base / pid
        if not folder.exists():
            return None
        try:
            return fmt.read_package(folder)
        except PackageError as exc:
            raise PackageError(
                "conflict",
                f"{PACKAGES_RELPATH}/{pid} exists but is not a readable package; "
                "move it away first",
                exc.problems,
            ) from exc

    def _registry_text(self) -> str | None:
        try:
            return self.registry.read_text(encoding="utf-8")
        except FileNotFoundError:
            return None

    def _registry_sidecars(self) -> dict[str, Any]:
        text = self._registry_text()
        if text is None:
            return {}
        try:
            data = json5.loads(text)
        except ValueError:
            return {}
        sidecars = data.get("sidecars") if isinstance(data, dict) else None
        return sidecars if isinstance(sidecars, dict) else {}

    def _managed_ids(self) -> list[str]:
        ids = set(self.installed_ids()) | set(self.staged()) | set(self._dirs(self.previous))
        ids |= set(read_upgrades(self.upgrades_path).packages)
        journal = read_journal(self.journal_path)
        if journal is not None:
            ids.add(journal.id)
        return sorted(ids)

    def overlays(self) -> dict[str, tuple[UpgradeField, Reason | None]]:
        """The ``upgrade`` field (and its reason) of every managed package, for the snapshot."""
        journal = read_journal(self.journal_path)
        records = read_upgrades(self.upgrades_path).packages
        staged = self.staged()
        out: dict[str, tuple[UpgradeField, Reason | None]] = {}
        for pid in self._managed_ids():
            j = journal if journal is not None and journal.id == pid else None
            rec = records.get(pid)
            state = derive_upgrade(journal=j, record=rec, staged=staged.get(pid))
            out[pid] = (state, upgrade_reason(pid, state, journal=j, record=rec))
        return out

    def status(self, recovered: list[str] | None = None) -> PackagesStatus:
        """Every managed package: versions installed, staged and previous, state, problems."""
        journal = read_journal(self.journal_path)
        records = read_upgrades(self.upgrades_path).packages
        staged = self.staged()
        entries = self._registry_sidecars()
        overlays = self.overlays()
        infos = []
        for pid in self._managed_ids():
            state, reason = overlays[pid]
            inst = self._read(self.base / pid) if (self.base / pid).is_dir() else None
            staged_pkg = self._read(self.staging / staged[pid]) if pid in staged else None
            entry = entries.get(pid)
            reg_version = entry.get("packageVersion") if isinstance(entry, dict) else None
            problems = []
            if (self.base / pid).exists() and inst is None:
                problems.append(f"{PACKAGES_RELPATH}/{pid}/package.toml is missing or invalid")
            if inst is not None and entry is None:
                problems.append(f"installed but {self._rel(self.registry)} has no entry {pid}")
            elif inst is not None and reg_version != inst.version and journal is None:
                problems.append(
                    f"registry says {reg_version}, {PACKAGES_RELPATH}/{pid} holds {inst.version}"
                )
            rec = records.get(pid)
            shown = inst or staged_pkg
            infos.append(
                PackageInfo(
                    id=pid,
                    upgrade=state,
                    installed=inst.version if inst else None,
                    staged=staged_pkg.version if staged_pkg else None,
                    previous=self._version_of(self.previous / pid),
                    registryVersion=reg_version if isinstance(reg_version, str) else None,
                    tools=list(shown.tools) if shown is not None else [],
                    message=(reason.message if reason else (rec.message if rec else "")),
                    problems=problems,
                )
            )
        tx = None
        if journal is not None:
            tx = TransactionInfo(
                op=journal.op,
                id=journal.id,
                fromVersion=journal.fromVersion,
                toVersion=journal.toVersion,
                committed=journal.committed,
            )
        return PackagesStatus(packages=infos, transaction=tx, recovered=list(recovered or []))

    def pending_verifications(self) -> list[str]:
        """Packages applied or rolled back whose new version no host has seen ready yet."""
        records = read_upgrades(self.upgrades_path).packages
        return sorted(pid for pid, r in records.items() if r.state == "verifying")

    def record(self, pid: str) -> UpgradeRecord | None:
        return read_upgrades(self.upgrades_path).packages.get(pid)

    # registry entries ----------------------------------------------------------------------

    def build_entry(self, pkg: PackageFile, current: Any) -> dict[str, Any]:
        """The registry entry for ``pkg``: its own fields, the operator's settings kept from
        ``current`` (the entry now), and the package's defaults where the operator has none."""
        cmd, args = fmt.registry_command(pkg, f"{PACKAGES_RELPATH}/{pkg.id}")
        owned: dict[str, Any] = {
            "command": cmd,
            **({"args": args} if args else {}),
            "cwd": "app",
            "protocol": pkg.kind,
            "mode": pkg.mode,
            "tools": list(pkg.tools),
            "packageId": pkg.id,
            "packageVersion": pkg.version,
            "protocolVersion": pkg.protocol,
            "compatibleCore": pkg.compatible_core,
        }
        kept = (
            {k: v for k, v in current.items() if k not in fmt.OWNED_KEYS}
            if isinstance(current, dict)
            else {}
        )
        defaults = {k: v for k, v in pkg.defaults.items() if k not in kept}
        return {**owned, **defaults, **kept}

    def registry_with(self, pkg: PackageFile, text: str | None = None) -> str:
        """The registry text with ``pkg``'s entry swapped in (validated).

        Raises:
            PackageError: ``invalid-package`` if the entry would be invalid, ``conflict`` if the
                registry itself cannot be parsed.
        """
        text = self._registry_text() if text is None else text
        current = None
        if text is not None and text.strip():
            try:
                data = json5.loads(text)
            except ValueError as exc:
                raise PackageError(
                    "conflict", f"{jsonc_error(exc, self._rel(self.registry))}; fix it"
                ) from exc
            sidecars = data.get("sidecars") if isinstance(data, dict) else None
            current = sidecars.get(pkg.id) if isinstance(sidecars, dict) else None
        entry = self.build_entry(pkg, current)
        problems = validate_entry(pkg.id, entry)
        if problems:
            raise PackageError(
                "invalid-package",
                f"the registry entry for {pkg.id} {pkg.version} would be invalid",
                problems,
            )
        try:
            new_text, _ = set_sidecar(text, pkg.id, entry)
        except ValueError as exc:
            raise PackageError("conflict", f"{self._rel(self.registry)}: {exc}") from exc
        return new_text

    def regenerate_next(self) -> None:
        """Write ``external.tools.jsonc.next`` for what is staged (remove it when nothing is)."""
        staged = self.staged()
        if not staged:
            if self.next.exists():
                remove_tree(self.next)
            return
        text = self._registry_text()
        for pid in sorted(staged):
            pkg = self._read(self.staging / staged[pid])
            if pkg is None:
                continue
            try:
                text = self.registry_with(pkg, text)
            except PackageError as exc:
                if exc.code == "conflict":
                    return  # the registry cannot be parsed: leave .next as it was
                continue
        if text is None:
            return
        try:
            if self.next.read_text(encoding="utf-8") == text:
                return
        except FileNotFoundError:
            pass
        atomic_write(self.next, text.encode("utf-8"), mode=self._registry_mode())

    def _registry_mode(self) -> int:
        try:
            return self.registry.stat().st_mode & 0o777
        except FileNotFoundError:
            return 0o644

    # stage ---------------------------------------------------------------------------------

    def _source(self, source: str | os.PathLike[str]) -> Path:
        src = Path(source)
        return src if src.is_absolute() else self.app_root / src

    def _check_stage(self, root: Path) -> tuple[PackageFile, PackageFile | None]:
        pkg = fmt.load_verified(root, self.host_version)
        current = self.installed(pkg.id)
        if current is not None and current.version == pkg.version:
            raise PackageError(
                "conflict", f"{pkg.id} {pkg.version} is already installed; bump the version"
            )
        self.registry_with(pkg)  # refuse now what apply would refuse later
        return pkg, current

    def check_stage(self, source: str | os.PathLike[str]) -> None:
        """Every check :meth:`stage` makes, writing nothing (not even the lock file): callers
        run it before taking the lock when ``tools/packages`` does not exist yet, so a refused
        first package leaves the app root as it was.

        Raises:
            PackageError: what :meth:`stage` would refuse.
        """
        with fmt.open_source(self._source(source)) as root:
            self._check_stage(root)

    def stage(self, source: str | os.PathLike[str]) -> StageResult:
        """Verify a package and stage it; the installed version keeps serving.

        Raises:
            PackageError: the package is refused (nothing was changed).
        """
        with fmt.open_source(self._source(source)) as root:
            pkg, current = self._check_stage(root)
            make_dirs(self.staging)
            tmp = self.staging / f".incoming-{uuid.uuid4().hex[:12]}"
            try:
                copy_tree(root, tmp)
                atomic_write(tmp / fmt.PACKAGE_FILE, fmt.render_package(pkg))
                fmt.verify_payload(tmp, pkg)
                crash_point("stage:copied")
                name = f"{pkg.id}@{pkg.version}"
                replaced = None
                for pid, other in self.staged().items():
                    if pid == pkg.id:  # one staged version per package: drop the other
                        replaced = other.partition("@")[2]
                        dropped = self.staging / f".incoming-{uuid.uuid4().hex[:12]}-dropped"
                        durable_rename(self.staging / other, dropped)  # atomic, then delete
                        remove_tree(dropped)
                durable_rename(tmp, self.staging / name)
            except BaseException:
                if tmp.exists():
                    remove_tree(tmp)
                raise
        crash_point("stage:renamed")
        self.regenerate_next()
        return StageResult(
            id=pkg.id,
            version=pkg.version,
            staged=self._rel(self.staging / name),
            installed=current.version if current else None,
            replaced=replaced if replaced != pkg.version else None,
        )

    # apply / rollback ----------------------------------------------------------------------

    def _check_id(self, pid: str) -> None:
        if not re.match(PACKAGE_ID_PATTERN, pid):
            raise PackageError("not-found", f"{pid!r} is not a package id")

    def prepare_apply(self, pid: str, *, auto_rollback: bool = False) -> Transaction:
        """Plan applying the staged version of ``pid`` (checks everything, changes nothing).

        Raises:
            PackageError: nothing staged, the staged package no longer verifies, ...
        """
        self._check_id(pid)
        name = self.staged().get(pid)
        if name is None:
            raise PackageError(
                "not-found", f"nothing is staged for {pid} (run `toolhost pkg stage SOURCE`)"
            )
        pkg = fmt.load_verified(self.staging / name, self.host_version)
        current = self.installed(pid)
        if current is not None and current.version == pkg.version:
            raise PackageError("conflict", f"{pid} {pkg.version} is already installed")
        text = self.registry_with(pkg)
        tx = uuid.uuid4().hex[:12]
        moves = []
        if os.path.lexists(self.previous / pid):
            moves.append(
                Move(step="previous-trashed", src=f".previous/{pid}", dst=f".trash/{tx}/previous")
            )
        if current is not None:
            moves.append(Move(step="current-moved", src=pid, dst=f".previous/{pid}"))
        moves.append(Move(step="staged-moved", src=f".staging/{name}", dst=pid))
        journal = Journal(
            tx=tx,
            op="apply",
            id=pid,
            fromVersion=current.version if current else None,
            toVersion=pkg.version,
            moves=moves,
            registryBefore=sha256_file(self.registry),
            registryAfter=sha256_text(text),
            autoRollback=auto_rollback,
        )
        return Transaction(journal=journal, registry_text=text)

    def prepare_rollback(self, pid: str) -> Transaction:
        """Plan restoring ``.previous/<pid>``; the version it replaces becomes the previous one.

        Raises:
            PackageError: ``not-found`` without a previous version; it no longer verifies.
        """
        self._check_id(pid)
        folder = self.previous / pid
        if not folder.is_dir():
            raise PackageError("not-found", f"{pid} has no previous version to roll back to")
        prev = fmt.load_verified(folder, self.host_version)
        current = self.installed(pid)
        text = self.registry_with(prev)
        tx = uuid.uuid4().hex[:12]
        moves = []
        if current is not None:
            moves.append(Move(step="current-set-aside", src=pid, dst=f".trash/{tx}/current"))
        moves.append(Move(step="previous-restored", src=f".previous/{pid}", dst=pid))
        if current is not None:
            moves.append(
                Move(
                    step="current-kept-as-previous",
                    src=f".trash/{tx}/current",
                    dst=f".previous/{pid}",
                )
            )
        journal = Journal(
            tx=tx,
            op="rollback",
            id=pid,
            fromVersion=current.version if current else None,
            toVersion=prev.version,
            moves=moves,
            registryBefore=sha256_file(self.registry),
            registryAfter=sha256_text(text),
        )
        return Transaction(journal=journal, registry_text=text)

    def execute(self, txn: Transaction) -> None:
        """Run a planned transaction through the journal.

        Raises:
            PackageError: ``io-failed``; before the commit every step was undone, after it
                (``committed``) recovery finishes the bookkeeping.
        """
        j = txn.journal
        op = j.op
        write_journal(self.journal_path, j)
        crash_point(f"{op}:journal-written")
        try:
            for i, move in enumerate(j.moves):
                durable_rename(self.base / move.src, self.base / move.dst)
                crash_point(f"{op}:{move.step}")  # before the journal counts it: the hard case
                j.done = i + 1
                write_journal(self.journal_path, j)
            if sha256_file(self.registry) != j.registryBefore:
                raise PackageError(
                    "conflict",
                    f"{self._rel(self.registry)} was edited during the {op} of {j.id}; "
                    "nothing was changed: run it again",
                )
            atomic_write(self.next, txn.registry_text.encode("utf-8"), mode=self._registry_mode())
            crash_point(f"{op}:next-written")
            durable_rename(self.next, self.registry)
            crash_point(f"{op}:registry-swapped")
        except (OSError, PackageError) as exc:
            if sha256_file(self.registry) == j.registryAfter:
                raise PackageError(
                    "io-failed", f"{op} of {j.id} committed but not finished: {exc}", committed=True
                ) from exc
            self._undo(j)
            if isinstance(exc, PackageError):
                raise
            raise PackageError("io-failed", f"{op} of {j.id} failed and was undone: {exc}") from exc
        j.committed = True
        write_journal(self.journal_path, j)
        crash_point(f"{op}:journal-committed")
        self._finish(j)

    def _undo(self, j: Journal) -> list[str]:
        undone = undo_moves(self.base, j, self.journal_path)
        self._tidy_trash(j.tx, discard=False)
        if self.previous.is_dir() and not any(self.previous.iterdir()):
            remove_tree(self.previous)  # made by a rename that was undone
        remove_journal(self.journal_path)
        self.regenerate_next()
        return undone

    def _finish(self, j: Journal) -> None:
        upgrades = read_upgrades(self.upgrades_path)
        upgrades.packages[j.id] = UpgradeRecord(
            state="verifying",
            op=j.op,
            fromVersion=j.fromVersion,
            toVersion=j.toVersion,
            autoRollback=j.autoRollback,
        )
        write_upgrades(self.upgrades_path, upgrades)
        crash_point(f"{j.op}:state-written")
        self._tidy_trash(j.tx, discard=True)
        self.regenerate_next()
        crash_point(f"{j.op}:cleaned")
        remove_journal(self.journal_path)

    def _tidy_trash(self, tx: str, *, discard: bool) -> None:
        """Delete transaction ``tx``'s folder in ``.trash`` (with what it set aside when
        ``discard``, after a commit; only if empty after an undo), then an empty ``.trash``."""
        folder = self.trash / tx
        if discard or (folder.is_dir() and not any(folder.iterdir())):
            remove_tree(folder)
        if self.trash.is_dir() and not any(self.trash.iterdir()):
            remove_tree(self.trash)

    # recovery ------------------------------------------------------------------------------

    def recover(self, *, refresh_next: bool = True) -> list[str]:
        """Finish or undo an interrupted transaction and clear leftovers; returns what it did.

        The registry swap is the commit point: if the registry holds the text the journal
        commits, the transaction is finished (the new version awaits verification); otherwise
        every folder rename is undone and the staged version is staged again.

        ``refresh_next=False`` (before stage, apply and rollback, which may yet be refused)
        leaves ``external.tools.jsonc.next`` alone unless a transaction was finished or undone:
        a refused operation must not rewrite it; a successful one regenerates it anyway.
        """
        if not self.exists():
            return []
        done: list[str] = []
        j = read_journal(self.journal_path)
        if j is not None:
            what = f"{j.op} of {j.id} ({j.fromVersion or 'none'} -> {j.toVersion})"
            if j.committed or sha256_file(self.registry) == j.registryAfter:
                self._finish(j)
                done.append(f"completed the interrupted {what}; it awaits verification")
            else:
                undone = self._undo(j)
                kept = j.fromVersion or "nothing"
                done.append(
                    f"undid the interrupted {what} ({len(undone)} step(s) reversed); "
                    f"{kept} stays installed"
                )
        for folder in (self.staging, self.base, self.registry.parent):
            for entry in _leftovers(folder):
                remove_tree(entry)
                done.append(f"removed the leftover {self._rel(entry)}")
        if self.trash.is_dir():
            for entry in self.trash.iterdir():
                remove_tree(entry)
                done.append(f"removed the leftover {self._rel(entry)}")
            remove_tree(self.trash)
        if refresh_next:
            self.regenerate_next()
        return done

    # verification --------------------------------------------------------------------------

    def settle_verification(
        self, pid: str, verdict: Verdict, message: str
    ) -> tuple[UpgradeRecord | None, bool]:
        """Record the host's verdict on a version awaiting verification.

        Returns:
            ``(record, auto_rollback)``: the record left (None: idle) and whether the operator
            asked for an automatic rollback of this failure.
        """
        upgrades = read_upgrades(self.upgrades_path)
        record = upgrades.packages.get(pid)
        if record is None or record.state != "verifying" or verdict == "pending":
            return record, False
        has_previous = (self.previous / pid / fmt.PACKAGE_FILE).is_file()
        new, auto = settle(pid, record, verdict, message, has_previous=has_previous)
        if new is None:
            del upgrades.packages[pid]
        else:
            upgrades.packages[pid] = new
        write_upgrades(self.upgrades_path, upgrades)
        return new, auto


def _leftovers(folder: Path) -> list[Path]:
    """Temp names a crash can leave: ``.incoming-*`` stagings and ``.<name>.tmp-<pid>`` files."""
    try:
        names = [e.name for e in os.scandir(folder)]
    except FileNotFoundError:
        return []
    return [
        folder / n
        for n in names
        if n.startswith(".") and (n.startswith(".incoming-") or ".tmp-" in n)
    ]
