"""The host: the lifecycle of one running registry (start, reload, stop) over the parts it owns.

# Strategy: :func:`build_host` finishes an interrupted package operation, reads the registry
# and builds a :class:`Host` from what it read; the host's constructor builds every part, each
# handed its collaborators at construction (nothing is wired by assignment afterwards): the
# catalog and its :class:`~supervisor.host.catalog_feed.CatalogFeed`, the usage (accounting,
# quotas, guard, sampler), the audit log and telemetry the registry asks for, the
# :class:`~supervisor.calls.invoke.Invoker` (the call path), the operator event bus, the host
# services, the views and the upgrade service. :meth:`Host.run` owns the nursery every pool and
# background task runs in; the host itself only starts, reloads and stops: it serves no call
# and renders no view. A reload is a pure diff of two plans (``host/reload.py``) applied here.
# The server is handed the invoker and the views, never the host's insides.
"""

from __future__ import annotations

import logging
import os
import random
from functools import partial

import trio

import supervisor
from supervisor import telemetry
from supervisor.calls.approvals import Approvals
from supervisor.calls.audit import AuditLog
from supervisor.calls.invoke import Invoker
from supervisor.calls.timers import Timers
from supervisor.contracts.confine import EgressRecord
from supervisor.contracts.registry import HostConfig
from supervisor.contracts.snapshot import ZygoteStatus
from supervisor.host import launch
from supervisor.host.catalog_feed import CatalogFeed
from supervisor.host.confinement import Confiner
from supervisor.host.egress import EgressProxy
from supervisor.host.loading import HostOptions, Loaded, load
from supervisor.host.offers import HostedOffers
from supervisor.host.reload import ReloadResult, diff_plans, needs_restart
from supervisor.host.services import HostServices
from supervisor.host.tokens import TokenFiles
from supervisor.host.unix_gate import UnixGate
from supervisor.host.upgrades import Upgrades, recover
from supervisor.host.usage import Usage
from supervisor.host.views import HostViews
from supervisor.packages.manager import PackageManager
from supervisor.policy.redact import Redactor
from supervisor.pools.pool import Pool
from supervisor.pools.spec import Collaborators
from supervisor.processes import zygote
from supervisor.processes.spawn import Spawner
from supervisor.registry.catalog import CatalogState, SidecarFacts
from supervisor.registry.load import Registry
from supervisor.registry.manifests import KnownCatalog
from supervisor.registry.plan import Plan, SidecarPlan
from supervisor.telemetry.events import EventBus
from supervisor.telemetry.logs import StderrLines

log = logging.getLogger("toolhost.host")


class HostStartError(Exception):
    """The host refuses to start (a symlinked audit log or token, ...): the message says why."""


async def build_host(options: HostOptions, *, redactor: Redactor | None = None) -> Host:
    """The host ``options`` describe, ready for :meth:`Host.run`: finishes or undoes a package
    operation a crash interrupted, then reads the registry and builds the host from it.

    Args:
        options: Where the registry is and how to run.
        redactor: The host's redactor (the caller may have handed it to its log formatter).
    """
    started_at = trio.current_time()
    version = supervisor.__version__
    manager = PackageManager(
        options.app_root, registry_path=options.registry_path, host_version=version
    )
    recovered = await recover(manager)  # an interrupted package apply/rollback, before reading
    return Host(
        options,
        load(options),
        started_at=started_at,
        redactor=redactor or Redactor(),
        manager=manager,
        recovered=recovered,
    )


class Host:
    """A running tool host (built by :func:`build_host`).

    Args:
        options: How it was asked to run.
        loaded: The registry, known catalog and plan it starts from.
        started_at: When it started (``trio.current_time``).
        redactor: Masks the secrets handed to sidecars (envelopes, logs, stderr, spans).
        manager: The package manager of its app root.
        recovered: What the package manager recovered at start.
    """

    def __init__(
        self,
        options: HostOptions,
        loaded: Loaded,
        *,
        started_at: float,
        redactor: Redactor,
        manager: PackageManager,
        recovered: list[str],
    ) -> None:
        self.options = options
        self.app_root = os.path.abspath(options.app_root)
        self.version = supervisor.__version__
        self.loaded = loaded
        self.started_at = started_at
        self.started_host: HostConfig = loaded.registry.host
        """The ``host`` settings this run started with (a reload compares against them)."""
        self.rng = random.Random(options.seed)
        self.redactor = redactor
        self.pools: dict[str, Pool] = {}
        self.endpoints: dict[str, str] = {}
        self.zygote: zygote.Zygote | None = None
        self.egress = EgressProxy(audit=self._audit_line)
        """The egress proxy of confined sidecars (``network.allow``, ``loopback``)."""
        self.confiner = Confiner()
        """Each sidecar's confinement plan and walls (PROTOCOL 7), per registry load."""
        self.spawner = Spawner()
        """How workers start: exec, or from :attr:`zygote` once it runs (handed to every worker in
        its launch spec)."""
        hcfg = loaded.registry.host
        self.catalog = CatalogState(allow_degraded=hcfg.allow_degraded)
        self.feed = CatalogFeed(self.catalog)
        self.usage = Usage(
            self.catalog,
            self.feed.publish,
            lambda: self.pools,
            quota_state=loaded.registry.path(hcfg.quota_state) if hcfg.quota_state else None,
        )
        # What the registry turns on at start (read once per run; a reload keeps them).
        self.telemetry = telemetry.start(
            hcfg.telemetry.enabled,
            capture_content=hcfg.telemetry.capture_content,
            redact=redactor.text,
            queue_depth=self._queue_depths,
        )
        """OpenTelemetry spans and metrics (docs/telemetry.md); None when off."""
        if self.telemetry is not None:  # sidecars export their own spans there (confined too)
            self.confiner.collector = self.telemetry.endpoint
        json_logs = (options.log_format or hcfg.log_format) == "json"
        self.stderr_lines = StderrLines() if json_logs else None
        """JSON logs: sidecar stderr lines forwarded as records; None with text logs."""
        self.audit = (
            AuditLog(
                loaded.registry.path(hcfg.audit_log),
                max_bytes=hcfg.audit_max_bytes,
                keep=hcfg.audit_keep,
            )
            if hcfg.audit_log and options.audit
            else None
        )
        # The call path.
        timers = Timers()
        self.approvals = Approvals(timers, trio.current_time)
        """Calls waiting for an operator (calls/approvals.py)."""
        self.invoker = Invoker(
            self.catalog,
            self.pools,
            self.usage.quotas,
            self.usage.record,
            timers=timers,
            approvals=self.approvals,
            audit=self.audit,
            telemetry=self.telemetry,
            redact=redactor.envelope,
        )
        # Operator events (events.subscribe): the call path is hooked only while watched.
        self.events = EventBus(lambda: list(self.pools.values()), self.invoker.engine.watch)
        self.views = HostViews(
            loaded,
            self.catalog,
            self.pools,
            self.usage,
            started_at=started_at,
            zygote=self._zygote_status,
            confinement=self.confiner.label,
            egress=self.egress.statistics,
            hints=self.confiner.hints,
        )
        self.services = HostServices(
            self.invoker,
            self.app_root,
            redactor=redactor,
            on_secret=self.invoker.engine.mask_secrets,
            sidecar_config=self.views.running_config,
            manifest=self.views.manifest_of,
            count_request=self.usage.accounting.count_request,
        )
        self.offers = HostedOffers(self.views, self.feed)
        """The hosted MCP servers' resources, prompts, subscriptions and list changes."""
        self.upgrades = Upgrades(manager, recovered, host=self, feed=self.feed, views=self.views)
        self.tokens = TokenFiles(self.approvals, self.audit)
        """Tokens read at start and again at every reload, never per use (the operator's, the
        gateway's); a change is written to the audit log."""
        self._nursery: trio.Nursery | None = None
        self._stop = trio.Event()
        self._stopped = trio.Event()
        self._reload_lock = trio.Lock()

    @property
    def registry(self) -> Registry:
        return self.loaded.registry

    @property
    def known(self) -> KnownCatalog:
        return self.loaded.known

    @property
    def plan(self) -> Plan:
        return self.loaded.plan

    @property
    def host_private(self) -> tuple[str, ...]:
        """Paths no tool may touch (PROTOCOL 1), sent to every worker in ``init``."""
        return self.loaded.host_private

    # lifecycle ---------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[Host] = trio.TASK_STATUS_IGNORED) -> None:
        """Start every runnable sidecar and serve until :meth:`stop`.

        Raises:
            HostStartError: A private file (audit log, operator token) cannot be trusted.
        """
        self.upgrades.refresh()
        self.feed.load(self.plan)
        self.usage.configure(self.registry, self.plan)
        self.confiner.configure(self.loaded)
        self.feed.set_denied(self.confiner.denials)
        try:
            self._open_private_files()
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                if self.audit is not None:
                    await nursery.start(self.audit.run)
                await nursery.start(self.invoker.run_timers)
                if self.registry.host.confinement != "off":
                    self.confiner.attach(await nursery.start(self.egress.run))
                    self.confiner.gate = await nursery.start(UnixGate().run)
                await nursery.start(self.services.run)
                await nursery.start(self.offers.watch)
                await self.usage.start(nursery)
                await self._start_zygote(nursery)
                for sp in self.plan.sidecars.values():
                    await self._start_pool(sp)
                await nursery.start(self.upgrades.run)
                task_status.started(self)
                await self._stop.wait()
                await self._drain()
                async with trio.open_nursery() as stopping:
                    for pool in list(self.pools.values()):
                        stopping.start_soon(partial(pool.stop, drain_s=0.0))
                self.invoker.shutdown()
                nursery.cancel_scope.cancel()
        finally:
            self.feed.close()
            self.confiner.close()
            await self._stop_telemetry()
            self._stopped.set()

    def stop(self) -> None:
        """Ask :meth:`run` to stop every sidecar gracefully and return."""
        self._stop.set()

    async def wait_stopped(self) -> None:
        """Return once :meth:`run` has stopped every sidecar."""
        await self._stopped.wait()

    def _configure_approvals(self) -> None:
        """Operator approval (calls/approvals.py): the setting and the token next to the
        socket (at start and whenever a reload swaps the registry)."""
        registry = self.registry
        socket = (
            self.options.socket or self.endpoints.get("unix") or registry.path(registry.host.socket)
        )
        self.approvals.configure(registry.host.approval_source, socket)

    def _open_private_files(self) -> None:
        """The audit log and the operator token, opened at start (private_files.py).

        Raises:
            HostStartError: One is a symlink, another user's, or cannot be read or created.
        """
        self._configure_approvals()
        try:
            self.tokens.open(self.registry.host.approval_source)
        except (OSError, ValueError) as exc:
            raise HostStartError(f"cannot start: {exc}") from exc

    def _grace_s(self) -> float:
        """``host.shutdownGraceMs`` in seconds: how long a stopping pool lets its calls run."""
        return self.registry.host.shutdown_grace_ms / 1000.0

    async def _drain(self) -> None:
        """The shutdown drain: no new calls; running ones get ``host.shutdownGraceMs`` to end,
        then the rest are cancelled with a message that names the setting."""
        for pool in list(self.pools.values()):
            pool.refuse_new()
        self.invoker.shutdown()  # calls waiting for a retry: refused now
        grace_ms = self.registry.host.shutdown_grace_ms
        why = f"host shutting down: shutdownGraceMs ({grace_ms} ms) elapsed"
        cut = await self.invoker.drain(self._grace_s(), why)
        if cut:
            log.warning("%s: cancelled %d running call(s)", why, cut)

    async def _stop_telemetry(self) -> None:
        """Flush what is left, bounded: a collector that is down must not hold the stop."""
        tel = self.telemetry
        if tel is None:
            return
        with trio.CancelScope(shield=True), trio.move_on_after(5):
            await trio.to_thread.run_sync(tel.shutdown, abandon_on_cancel=True)

    def _audit_line(self, record: EgressRecord) -> None:
        self.confiner.note_egress(record)
        if self.audit is not None:
            self.audit.line(record)

    def _queue_depths(self) -> list[tuple[str, int]]:
        """``(sidecar, calls queued)`` of every pool (the queue-depth gauge)."""
        return [(sid, pool.dispatch.queued) for sid, pool in list(self.pools.items())]

    def _zygote_status(self) -> ZygoteStatus | None:
        return self.zygote.status() if self.zygote is not None else None

    async def _start_zygote(self, nursery: trio.Nursery) -> None:
        """Start this host's zygote (docs/zygote.md) unless it is off or another host in this
        process already runs one."""
        zcfg = self.registry.host.zygote
        if not zcfg.enabled or zygote.forced_exec() or zygote.running_here():
            return
        self.zygote = zygote.Zygote(
            zcfg.preload,
            reply_timeout_s=zcfg.reply_timeout_ms / 1000.0,
            app_root=self.app_root,
            on_change=self.feed.pulse,
        )
        await nursery.start(self.zygote.run)
        self.spawner = Spawner(self.zygote)

    # reload ------------------------------------------------------------------------------

    async def reload(self) -> ReloadResult:
        """Re-read the registry; restart only sidecars whose entry changed.

        Sidecars whose entry is unchanged keep serving without a dropped call. A file that cannot
        be parsed keeps everything as it was; a sidecar whose new entry is invalid keeps running
        its previous configuration. Either way the reasons are reported.
        """
        async with self._reload_lock:
            loaded = self.loaded
            new = load(self.options)
            if new.registry.unreadable:
                errors = list(new.registry.errors)
                return ReloadResult(applied=False, revision=self.catalog.revision, errors=errors)
            loaded.registry, loaded.known = new.registry, new.known
            loaded.host_private = new.host_private
            self._configure_approvals()
            result = ReloadResult(
                applied=True,
                revision=0,
                errors=list(new.registry.errors),
                needs_restart=needs_restart(self.started_host, new.registry.host),
            )
            if result.needs_restart:
                log.warning(
                    "reload: %s changed; a reload cannot apply that: the host keeps serving "
                    "with the old value until toolhost restarts",
                    ", ".join(result.needs_restart),
                )
            diff = diff_plans(loaded.plan, new.plan, self.pools)
            result.errors += diff.kept
            result.added, result.removed = diff.added, diff.removed
            result.restarted, result.unchanged = diff.restarted, diff.unchanged
            async with trio.open_nursery() as nursery:
                for sid in diff.stop:
                    pool = self.pools.pop(sid, None)
                    if pool is not None:
                        nursery.start_soon(partial(pool.stop, drain_s=self._grace_s()))
            loaded.plan = diff.plan
            self.feed.load(
                diff.plan, allow_degraded=new.registry.host.allow_degraded, reset=set(diff.stop)
            )
            self.usage.configure(loaded.registry, diff.plan)
            was_denied = set(self.confiner.denials)
            self.confiner.configure(loaded)
            self.feed.set_denied(self.confiner.denials)
            async with trio.open_nursery() as nursery:  # now refused: no worker of theirs runs
                for sid in self.confiner.denials:
                    pool = self.pools.pop(sid, None)
                    if pool is not None:
                        nursery.start_soon(partial(pool.stop, drain_s=self._grace_s()))
            # Refused before, allowed now (host.confinement changed): start them.
            allowed = sorted(was_denied - set(self.confiner.denials) - set(diff.start))
            diff.start += [s for s in allowed if s in diff.plan.sidecars and s not in self.pools]
            result.errors += self.tokens.reload(self.registry.host.approval_source)
            if self.zygote is not None:  # no worker may start from stale preloaded code
                self.zygote.preload = zygote.preload_list(self.registry.host.zygote.preload)
                self.zygote.replace()
            for sid in diff.unchanged:
                pool = self.pools.get(sid)
                if pool is not None:
                    self.feed.sidecar_facts(sid, pool.facts())
            for sid in diff.start:
                await self._start_pool(diff.plan.sidecars[sid])
            result.revision = self.catalog.revision
            return result

    # sidecars ----------------------------------------------------------------------------

    async def stop_sidecar(self, sidecar: str) -> bool:
        """Drain and stop one sidecar's pool; it stays in the plan (a reload or
        :meth:`start_sidecar` starts it again). False when it was not running."""
        async with self._reload_lock:
            pool = self.pools.pop(sidecar, None)
            if pool is None:
                return False
            await pool.stop(drain_s=self._grace_s())
            return True

    async def start_sidecar(self, sidecar: str) -> bool:
        """Start the pool of a planned sidecar that is not running (after :meth:`stop_sidecar`)."""
        async with self._reload_lock:
            sp = self.plan.sidecars.get(sidecar)
            if sp is None or sidecar in self.pools:
                return False
            await self._start_pool(sp)
            return sidecar in self.pools

    async def _start_pool(self, sp: SidecarPlan) -> None:
        if not sp.runnable or sp.config is None or sp.id in self.confiner.denials:
            return  # a denied sidecar (PROTOCOL 7 ``required``) is never started

        def publish(sidecar: str, facts: SidecarFacts) -> None:
            # A pool a reload replaced may still publish (its last "stopped", late): only the
            # pool serving the sidecar now (or none) speaks for it.
            if self.pools.get(sidecar, pool) is pool:
                self.feed.sidecar_facts(sidecar, facts)

        pool = Pool(
            launch.child_spec(
                sp,
                self._launch_context,
                restart_policy=self.options.restart_policy,
                attach=self.offers.attach,
            ),
            Collaborators(
                publish=publish,
                notify=self.feed.pulse,
                guard=self.usage.guard,
                services=self.services,
                redact=self.services.redactor.text,
                metering=self.telemetry.metering if self.telemetry is not None else None,
                stderr_lines=self.stderr_lines,
                events=self.events,
                rng=random.Random(self.rng.random()),
            ),
        )
        self.pools[sp.id] = pool
        assert self._nursery is not None
        await self._nursery.start(pool.run)

    def _launch_context(self) -> launch.LaunchContext:
        """What a worker's launch spec takes from this host now (``host/launch.py``)."""
        return launch.LaunchContext(
            project_dir=self.registry.project_dir,
            host_private=self.host_private,
            vault=self.services.vault,
            telemetry=self.telemetry is not None,
            cancel_grace_ms=self.options.cancel_grace_ms,
            stop_grace_ms=self.options.stop_grace_ms,
            spawner=self.spawner,
            confiner=self.confiner,
        )

    async def restart_sidecar(self, sidecar: str) -> bool:
        pool = self.pools.get(sidecar)
        if pool is None:
            return False
        await pool.restart()
        return True
