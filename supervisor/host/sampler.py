"""The accounting sampler: measures every worker's process tree each period and enforces the
per-worker and per-call resource quotas (``rssMb``, ``cpuSecondsPerCall``, ``limits.nproc``).

# Strategy: once per ``host.statsIntervalMs`` (default 1 s), on the trio thread, list the live
# processes of every worker and the calls running in each (:meth:`Worker.processes`); then read
# ``/proc`` through cached ``psutil.Process`` objects: each worker's descendants from
# ``/proc/<pid>/task/*/children`` (no scan of every process on the machine), then CPU times and
# RSS of each process; then fold the figures into :class:`Accounting` and act. This stays on the
# trio thread on purpose: it takes a fraction of a millisecond, while a worker thread doing it
# would contend for the GIL with the call path and hand it back and forth at every syscall.
# The CPU a process tree used since the previous sample is split evenly among the calls running
# in it; a call whose
# share passes its ``cpuSecondsPerCall`` fails ``quota-exceeded`` (its worker is killed and
# replaced, since a process cannot be made to drop one call). A tree over ``rssMb`` is killed
# when busy (the running call fails ``quota-exceeded`` with the measured figure) and recycled
# gracefully when idle; a tree with more than ``limits.nproc`` descendants is killed. Nothing
# here runs on the call path; precision is one period.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import msgspec
import psutil
import trio

from supervisor.host.accounting import Accounting
from supervisor.workers.base import ProcessView, Worker

if TYPE_CHECKING:
    from supervisor.pools.pool import Pool

MIB = 1024 * 1024
log = logging.getLogger("toolhost.sampler")


class TreeSample(msgspec.Struct, frozen=True):
    """One process and its descendants, measured together."""

    cpu: float
    """CPU seconds (user + system) of the tree, reaped children of its members included."""
    rss: int
    descendants: int


class Measurer:
    """Reads ``/proc`` for a set of root pids (used from one thread at a time)."""

    def __init__(self) -> None:
        self._cache: dict[int, psutil.Process] = {}
        self._me = psutil.Process()

    def _proc(self, pid: int) -> psutil.Process | None:
        proc = self._cache.get(pid)
        if proc is None:
            try:
                proc = self._cache[pid] = psutil.Process(pid)
            except psutil.Error:
                return None
        return proc

    def measure(self, roots: list[int]) -> tuple[dict[int, TreeSample], int, float]:
        """Samples of each root's tree, and the host's own RSS and CPU seconds."""
        children = _children_map(roots)
        out: dict[int, TreeSample] = {}
        used: set[int] = set()
        for root in roots:
            tree = [root]
            seen = {root}
            i = 0
            while i < len(tree):
                for child in children.get(tree[i], ()):
                    if child not in seen:
                        seen.add(child)
                        tree.append(child)
                i += 1
            cpu = 0.0
            rss = 0
            alive = False
            for pid in tree:
                proc = self._proc(pid)
                if proc is None:
                    continue
                used.add(pid)
                try:
                    with proc.oneshot():
                        t = proc.cpu_times()
                        mem = proc.memory_info()
                except psutil.Error:
                    self._cache.pop(pid, None)
                    continue
                alive = alive or pid == root
                cpu += t.user + t.system + t.children_user + t.children_system
                rss += mem.rss
            if alive:
                out[root] = TreeSample(cpu=cpu, rss=rss, descendants=len(tree) - 1)
        for pid in [p for p in self._cache if p not in used]:
            del self._cache[pid]
        host_rss, host_cpu = 0, 0.0
        with contextlib.suppress(psutil.Error):
            with self._me.oneshot():
                t = self._me.cpu_times()
                host_rss = self._me.memory_info().rss
            host_cpu = t.user + t.system
        return out, host_rss, host_cpu


def _proc_children(pid: int) -> list[int] | None:
    """Child pids from ``/proc/<pid>/task/*/children`` (None where the kernel lacks the file)."""
    out: list[int] = []
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/children", "rb") as f:
                out.extend(int(x) for x in f.read().split())
        except FileNotFoundError:
            if os.path.isdir(f"/proc/{pid}/task/{tid}"):
                return None  # a kernel without the file
            continue  # the thread ended meanwhile
        except (OSError, ValueError):
            continue
    return out


def _children_map(roots: list[int]) -> dict[int, list[int]]:
    """Parent -> children for the trees under ``roots`` only (no scan of every process on the
    machine), falling back to one scan where ``/proc/*/task/*/children`` is missing."""
    children: dict[int, list[int]] = {}
    todo = list(roots)
    while todo:
        pid = todo.pop()
        kids = _proc_children(pid)
        if kids is None:
            children = {}
            for p in psutil.process_iter(["ppid"]):
                ppid = p.info.get("ppid")
                if ppid:
                    children.setdefault(ppid, []).append(p.pid)
            return children
        if kids:
            children[pid] = kids
            todo.extend(kids)
    return children


class Sampler:
    """Samples the host's pools on a period and enforces resource quotas.

    Args:
        accounting: Where the figures go.
        pools: Returns the host's pools now.
        interval_s: The period.
    """

    def __init__(
        self,
        accounting: Accounting,
        pools: Callable[[], dict[str, Pool]],
        interval_s: float = 1.0,
    ) -> None:
        self.accounting = accounting
        self.pools = pools
        self.interval_s = interval_s
        self._measurer = Measurer()
        self._calls: dict[tuple[int, Any], float] = {}
        """Sampled CPU seconds of each running call, by ``(root pid, call key)``."""
        self._nursery: trio.Nursery | None = None
        self.ticked = trio.Event()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            failing = False
            while True:
                await trio.sleep(self.interval_s)
                try:
                    await self.tick()
                except OSError as exc:  # EMFILE reading /proc, ...: skip this sample, keep going
                    if not failing:
                        log.warning("accounting sampler: cannot measure now: %s", exc)
                    failing = True
                else:
                    if failing:
                        log.info("accounting sampler: measuring again")
                    failing = False

    async def tick(self) -> None:
        """Measure once and act on what was measured."""
        plan: list[tuple[Pool, Worker, list[ProcessView]]] = []
        roots: list[int] = []
        for pool in self.pools().values():
            for worker in pool.workers:
                views = worker.processes()
                plan.append((pool, worker, views))
                roots.extend(v.pid for v in views)
        samples, host_rss, host_cpu = self._measurer.measure(roots)
        await trio.lowlevel.checkpoint()
        acc = self.accounting
        acc.samples += 1
        acc.host_rss, acc.host_cpu = host_rss, host_cpu
        live_calls: set[tuple[int, Any]] = set()
        totals: dict[str, int] = {}
        for pool, worker, views in plan:
            usage = acc.worker_usage(worker)
            side = acc.sidecar_usage(pool.sidecar)
            rss = 0
            processes = 0
            for view in views:
                sample = samples.get(view.pid)
                if sample is None:
                    continue
                rss += sample.rss
                processes += 1 + sample.descendants
                first = view.pid not in usage.last
                delta = sample.cpu - usage.last.get(view.pid, 0.0)
                usage.last[view.pid] = sample.cpu
                delta = max(0.0, delta)
                usage.cpu += delta
                side.cpu += delta
                # A long-lived worker's first sample holds its start-up, not its calls' work.
                share = (
                    delta / len(view.calls) if view.calls and (view.per_call or not first) else 0.0
                )
                for key, tool in view.calls:
                    ck = (view.pid, key)
                    live_calls.add(ck)
                    used = self._calls.get(ck, 0.0) + share
                    self._calls[ck] = used
                    if share:
                        acc.attribute(tool, share)
                    self._check_cpu(pool, worker, view, key, tool, used)
                self._check_tree(pool, worker, view, sample)
            if not views:
                usage.last.clear()
            else:
                alive = {v.pid for v in views}
                for pid in [p for p in usage.last if p not in alive]:
                    del usage.last[pid]
            usage.rss = rss
            usage.peak_rss = max(usage.peak_rss, rss)
            usage.processes = processes
            totals[pool.sidecar] = totals.get(pool.sidecar, 0) + rss
        for sid, usage_side in acc.usage.items():
            usage_side.rss = totals.get(sid, 0)
            usage_side.peak_rss = max(usage_side.peak_rss, usage_side.rss)
        for ck in [k for k in self._calls if k not in live_calls]:
            del self._calls[ck]
        acc.forget_workers({w for _, w, _ in plan})
        self.ticked.set()
        self.ticked = trio.Event()

    # enforcement -------------------------------------------------------------------------

    def _check_cpu(
        self, pool: Pool, worker: Worker, view: ProcessView, key: Any, tool: str, used: float
    ) -> None:
        quota = pool.config.quota
        own = quota.tools.get(tool)
        limit = own.cpu_seconds_per_call if own is not None and own.cpu_seconds_per_call else 0.0
        limit = limit or quota.cpu_seconds_per_call
        if not limit or used <= limit:
            return
        details = {
            "rule": "cpuSecondsPerCall",
            "limitSeconds": limit,
            "measuredSeconds": round(used, 3),
            "enforcedBy": "sampling",
            "pid": view.pid,
        }
        message = f"{tool} used {used:.2f} s of CPU, over its cpuSecondsPerCall={limit:g}" + (
            "" if view.per_call else f"; worker {view.pid} of {pool.sidecar} is replaced"
        )
        self._act(pool, worker, view, "cpuSecondsPerCall", message, details, call=key)

    def _check_tree(
        self, pool: Pool, worker: Worker, view: ProcessView, sample: TreeSample
    ) -> None:
        nproc = pool.config.limits.nproc
        if nproc and sample.descendants > nproc:
            details = {
                "rule": "nproc",
                "limit": nproc,
                "measured": sample.descendants,
                "pid": view.pid,
            }
            message = (
                f"worker {view.pid} of {pool.sidecar} had {sample.descendants} processes below it, "
                f"over limits.nproc={nproc}; its process group was killed"
            )
            self._act(pool, worker, view, "nproc", message, details)
            return
        rss_mb = pool.config.quota.rss_mb
        if rss_mb and sample.rss > rss_mb * MIB:
            measured = round(sample.rss / MIB, 1)
            details = {"rule": "rssMb", "limitMb": rss_mb, "measuredMb": measured, "pid": view.pid}
            message = (
                f"process {view.pid} of {pool.sidecar} used {measured} MB RSS with its children, "
                f"over quota.rssMb={rss_mb}"
            )
            self._act(pool, worker, view, "rssMb", message, details, recycle_idle=True)

    def _act(
        self,
        pool: Pool,
        worker: Worker,
        view: ProcessView,
        rule: str,
        message: str,
        details: dict[str, Any],
        *,
        call: Any = None,
        recycle_idle: bool = False,
    ) -> None:
        """Kill (or, idle and ``recycle_idle``, gracefully recycle) what broke ``rule``.

        The calls are looked at again now: the figures were measured a moment ago, and a call
        that ended meanwhile must not be blamed (nor its worker killed for it).
        """
        if view.per_call:
            worker.exceed(view.pid, message, details)  # a no-op once that process is gone
            self.accounting.sidecar_usage(pool.sidecar).limit_actions[rule] += 1
            return
        usage = self.accounting.worker_usage(worker)
        if usage.acted:
            return
        running = {key for v in worker.processes() if v.pid == view.pid for key, _ in v.calls}
        if call is not None and call not in running:
            return
        usage.acted = True
        self.accounting.sidecar_usage(pool.sidecar).limit_actions[rule] += 1
        if running or not recycle_idle:
            worker.exceed(view.pid, message, details)
        elif self._nursery is not None and worker.state == "ready":
            worker.refuse_new_calls()  # it is idle, so let it go gracefully
            self._nursery.start_soon(lambda: worker.stop("recycled"))
