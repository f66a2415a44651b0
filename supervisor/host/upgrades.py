"""The host's side of package upgrades: run package operations against a live host, verify new
versions, and keep the snapshot's ``upgrade`` field equal to the package manager's state.

# Strategy: the package manager (``supervisor/packages``) does the file-system work in a worker
# thread; this service puts the live host around it. An apply or rollback is: mark the tools
# ``applying`` (hidden), drain and stop only that sidecar, run the journaled transaction, reload
# the registry (which starts only that sidecar again, on the new version), then watch the new
# pool's facts through ``CatalogFeed.wait_change`` until :func:`judge_start` gives a verdict, and
# record it (idle, or ``rollback-required``/``failed``, with ``autoRollback`` restoring the
# previous version). Operations run as tasks of the service's own nursery, so a client that
# disconnects half-way does not cancel a transaction; one operation runs at a time (a trio lock
# in the host, the manager's file lock against other processes). A transaction a crash
# interrupted is finished or undone by :func:`recover` before the host reads its registry.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from functools import partial
from typing import Any, Protocol, TypeVar

import msgspec
import trio

from supervisor.contracts.packages import ApplyResult, PackagesStatus, StageResult
from supervisor.contracts.snapshot import Reason
from supervisor.host.catalog_feed import CatalogFeed
from supervisor.host.views import HostViews
from supervisor.packages.errors import PackageError
from supervisor.packages.journal import Journal, UpgradeRecord
from supervisor.packages.manager import PackageManager, Transaction
from supervisor.packages.states import Verdict, judge_start


class Summary(Protocol):
    def summary(self) -> str: ...


class SidecarControl(Protocol):
    """What the upgrade service asks of the host that owns it (no import of the host)."""

    async def stop_sidecar(self, sidecar: str) -> bool: ...

    async def start_sidecar(self, sidecar: str) -> bool: ...

    async def reload(self) -> Summary: ...


log = logging.getLogger("toolhost.packages")

T = TypeVar("T")
LOCK_WAIT_S = 30.0
LOCK_POLL_S = 0.05
JUDGE_GRACE_S = 5.0


async def recover(manager: PackageManager) -> list[str]:
    """Finish or undo a transaction a crash interrupted (before the host reads its registry);
    what was done, one line each."""
    if not manager.exists():
        return []
    try:
        async with file_lock(manager):
            done = await trio.to_thread.run_sync(manager.recover)
    except PackageError as exc:
        log.error("packages: recovery failed: %s", exc)
        return []
    for line in done:
        log.warning("packages: %s", line)
    return done


class Upgrades:
    """Package operations and upgrade state for one host.

    Args:
        manager: The package manager of the host's app root.
        recovered: What :func:`recover` did at start (``packages.status`` shows it).
        host: Stops, starts and reloads sidecars.
        feed: Publishes the ``upgrade`` state; its pulses drive the verdicts.
        views: The plan, the pools' facts, the catalog's reasons.
    """

    def __init__(
        self,
        manager: PackageManager,
        recovered: list[str],
        *,
        host: SidecarControl,
        feed: CatalogFeed,
        views: HostViews,
    ) -> None:
        self.manager = manager
        self.recovered = recovered
        self.host = host
        self.feed = feed
        self.views = views
        self._op_lock = trio.Lock()
        self._nursery: trio.Nursery | None = None
        self._overlaid: set[str] = set()
        self._busy: set[str] = set()

    # life cycle ----------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Own the operations' tasks; verify versions a previous run left unverified."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            self.refresh()
            pending = (
                await trio.to_thread.run_sync(self.manager.pending_verifications)
                if self.manager.exists()
                else []
            )
            for pid in pending:
                nursery.start_soon(self._verify_pending, pid)
            task_status.started()
            await trio.sleep_forever()

    def refresh(self) -> None:
        """Copy the manager's state into the catalog's ``upgrade`` overrides."""
        try:
            overlays = self.manager.overlays() if self.manager.exists() else {}
        except PackageError as exc:
            log.error("packages: cannot read the package state: %s", exc)
            return
        for sid in self._overlaid - set(overlays) - self._busy:
            self.feed.set_upgrade(sid, None)
        for sid, (state, reason) in overlays.items():
            if sid not in self._busy:
                self.feed.set_upgrade(sid, state, reason)
        self._overlaid = set(overlays) | self._busy

    # operations ----------------------------------------------------------------------------

    async def status(self) -> PackagesStatus:
        return await trio.to_thread.run_sync(self.manager.status, self.recovered)

    async def stage(self, source: str) -> StageResult:
        return await self._owned(self._stage, source)

    async def apply(self, pid: str, *, auto_rollback: bool = False) -> ApplyResult:
        return await self._owned(self._apply, pid, auto_rollback)

    async def rollback(self, pid: str) -> ApplyResult:
        return await self._owned(self._rollback, pid)

    async def _stage(self, source: str) -> StageResult:
        if not self.manager.exists():  # a refused first package must not leave the lock file
            await trio.to_thread.run_sync(self.manager.check_stage, source)
        async with self._op_lock, file_lock(self.manager):
            await trio.to_thread.run_sync(partial(self.manager.recover, refresh_next=False))
            result = await trio.to_thread.run_sync(self.manager.stage, source)
        self.refresh()
        return result

    async def _apply(self, pid: str, auto_rollback: bool) -> ApplyResult:
        async with self._op_lock, file_lock(self.manager):
            await trio.to_thread.run_sync(partial(self.manager.recover, refresh_next=False))
            txn = await trio.to_thread.run_sync(
                lambda: self.manager.prepare_apply(pid, auto_rollback=auto_rollback)
            )
            return await self._transact(txn)

    async def _rollback(self, pid: str) -> ApplyResult:
        async with self._op_lock, file_lock(self.manager):
            await trio.to_thread.run_sync(partial(self.manager.recover, refresh_next=False))
            txn = await trio.to_thread.run_sync(self.manager.prepare_rollback, pid)
            return await self._transact(txn)

    async def _verify_pending(self, pid: str) -> None:
        async with self._op_lock, file_lock(self.manager):
            record = await trio.to_thread.run_sync(self.manager.record, pid)
            if record is None or record.state != "verifying":
                return
            result = await self._verify(pid, record)
            log.info("packages: verified %s %s: %s", pid, record.toVersion, result.upgrade)

    # the steps -----------------------------------------------------------------------------

    async def _transact(self, txn: Transaction) -> ApplyResult:
        """Swap versions of one sidecar on the live host, then verify the new one."""
        j = txn.journal
        pid = j.id
        host = self.host
        self._busy.add(pid)
        try:
            self.feed.set_upgrade(pid, "applying", _applying_reason(j))
            await host.stop_sidecar(pid)
            try:
                await trio.to_thread.run_sync(self.manager.execute, txn)
            except PackageError as exc:
                if not exc.committed:
                    await host.start_sidecar(pid)  # undone: the old version serves again
                    raise
                log.error("packages: %s", exc)
            result = await host.reload()
            log.info("packages: %s %s: %s", j.op, pid, result.summary())
        finally:
            self._busy.discard(pid)
            self.refresh()
        record = await trio.to_thread.run_sync(self.manager.record, pid)
        if record is None or record.state != "verifying":
            record = UpgradeRecord(
                state="verifying", op=j.op, fromVersion=j.fromVersion, toVersion=j.toVersion
            )
        return await self._verify(pid, record)

    async def _verify(self, pid: str, record: UpgradeRecord) -> ApplyResult:
        verdict, message = await self._judge(pid)
        left, auto = await trio.to_thread.run_sync(
            self.manager.settle_verification, pid, verdict, message
        )
        self.refresh()
        result = ApplyResult(
            id=pid,
            op=record.op,
            fromVersion=record.fromVersion,
            toVersion=record.toVersion,
            upgrade=self.views.upgrade_of(pid) or "idle",
            verified=verdict == "ready",
            message=left.message if left is not None else message,
        )
        if not auto:
            return result
        log.warning("packages: %s; rolling back as asked (autoRollback)", result.message)
        try:
            txn = await trio.to_thread.run_sync(self.manager.prepare_rollback, pid)
            back = await self._transact(txn)
        except PackageError as exc:
            return msgspec.structs.replace(
                result, message=f"{result.message}; the automatic rollback was refused: {exc}"
            )
        return ApplyResult(
            id=pid,
            op=record.op,
            fromVersion=record.fromVersion,
            toVersion=record.toVersion,
            upgrade=back.upgrade,
            verified=False,
            rolledBack=True,
            message=f"{result.message}; rolled back to {back.toVersion}"
            + (f" ({back.message})" if back.message else ""),
        )

    async def _judge(self, pid: str) -> tuple[Verdict, str]:
        """Watch the sidecar's facts until its start has a verdict (bounded by its deadlines)."""
        views = self.views
        sp = views.planned(pid)
        if sp is None:
            return "failed", f"the registry has no sidecar {pid}"
        cfg = sp.config
        if cfg is None:
            return "failed", "invalid registry entry: " + "; ".join(sp.entry.errors)
        limit_ms = cfg.probe.start_timeout_ms + cfg.probe.timeout_ms
        with trio.move_on_after(limit_ms / 1000.0 + JUDGE_GRACE_S):
            while True:
                sp = views.planned(pid) or sp
                facts = views.facts(pid)
                if facts is None and sp.runnable:
                    why = views.catalog_reason(pid) or "the host did not start it"
                    return "failed", why
                verdict, message = judge_start(facts, runnable=sp.runnable, problem=sp.problem)
                if verdict != "pending":
                    return verdict, message
                await self.feed.wait_change()
        return "failed", f"not ready within {limit_ms} ms"

    # plumbing ------------------------------------------------------------------------------

    async def _owned(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        """Run ``fn`` as a task of the service, so the caller leaving does not cancel it."""
        if self._nursery is None:
            raise PackageError("busy", "the host is starting; try again")
        done = trio.Event()
        box: dict[str, Any] = {}

        async def task() -> None:
            try:
                box["value"] = await fn(*args)
            except Exception as exc:
                box["error"] = exc
            finally:
                done.set()

        self._nursery.start_soon(task)
        await done.wait()
        if "error" in box:
            raise box["error"]
        if "value" not in box:
            raise PackageError(
                "io-failed", "the host stopped during the operation; its next start recovers it"
            )
        return box["value"]


@asynccontextmanager
async def file_lock(manager: PackageManager) -> AsyncIterator[None]:
    """The manager's cross-process lock, waited for without blocking the event loop."""
    lock = manager.lock
    # Another process holds it (a `toolhost pkg` command without a host): no event crosses
    # processes, so retry for a bounded time.
    for _ in range(int(LOCK_WAIT_S / LOCK_POLL_S)):
        if await trio.to_thread.run_sync(lock.try_acquire):
            break
        await trio.sleep(LOCK_POLL_S)
    if not lock.held:
        raise PackageError(
            "busy", f"another package operation is in progress (pid {lock.holder()})"
        )
    try:
        yield
    finally:
        lock.release()


def _applying_reason(j: Journal) -> Reason:
    verb = "rolling back" if j.op == "rollback" else "applying"
    return Reason(
        field="upgrade",
        code="upgrade-applying",
        message=f"{verb} {j.id} {j.fromVersion or '(none)'} -> {j.toVersion}",
        hint="wait for `toolhost pkg status` to show idle",
    )
