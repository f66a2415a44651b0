"""The host: registry -> plan -> catalog, one pool per runnable sidecar, and the invoke path.

# Strategy: the host owns the nursery every pool runs in and the catalog every fact flows into.
# Calls go through the :class:`~supervisor.calls.invoke.Invoker`, built from the narrow parts
# it needs (catalog, pools, quotas, accounting, audit); the host only owns their lives.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import random
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import msgspec
import trio

import supervisor
from supervisor import telemetry
from supervisor.calls.approvals import token_path
from supervisor.calls.audit import AuditLog
from supervisor.calls.invoke import Invoker
from supervisor.contracts import wire
from supervisor.contracts.envelope import Envelope
from supervisor.contracts.manifest import ToolManifest
from supervisor.contracts.registry import HostConfig, SidecarConfig
from supervisor.contracts.rpc import (
    Approval,
    Catalog,
    CatalogChanged,
    HealthCounts,
    HealthResult,
    RegistryStatus,
)
from supervisor.contracts.snapshot import Descriptor, Reason, SidecarStatus, UpgradeField
from supervisor.contracts.stats import StatsResult
from supervisor.host import launch
from supervisor.host.safeguards import Safeguards
from supervisor.host.services import HostServices
from supervisor.host.upgrades import Upgrades
from supervisor.policy.naming import provider_name
from supervisor.pools.pool import Pool
from supervisor.pools.spec import Collaborators
from supervisor.private_files import TokenFile
from supervisor.processes import zygote
from supervisor.processes.spawn import Spawner
from supervisor.registry.catalog import Catalog as CatalogState
from supervisor.registry.catalog import SidecarFacts
from supervisor.registry.check import every_problem
from supervisor.registry.discover import add_discovered, scan_all
from supervisor.registry.load import Registry, load_registry
from supervisor.registry.manifests import KnownCatalog, bundled_manifest_dir, load_known_catalog
from supervisor.registry.plan import Plan, SidecarPlan, build_plan
from supervisor.telemetry.events import EventBus
from supervisor.telemetry.logs import StderrLines
from supervisor.workers.base import ProgressSink

if TYPE_CHECKING:
    from supervisor.telemetry.tracing import Tracing

SUBSCRIBER_BUFFER = 256

log = logging.getLogger("toolhost.host")


class HostOptions(msgspec.Struct, kw_only=True):
    """How to find the registry; defaults follow PROTOCOL 1."""

    app_root: str
    registry_path: str | None = None
    global_registry: str | None = None
    use_global: bool = True
    manifest_dirs: list[str] | None = None
    seed: int | None = None
    cancel_grace_ms: int = 500
    stop_grace_ms: int = 2000
    restart_policy: str | None = None
    """Override every sidecar's restart policy (``toolhost doctor`` starts each one once)."""
    audit: bool = True
    log_format: str | None = None
    """``text`` | ``json`` over ``host.logFormat`` (``toolhost serve --log-format``)."""
    socket: str | None = None
    """The socket it will be served on, when not ``host.socket`` (``toolhost serve --socket``)."""


class HostStartError(Exception):
    """The host refuses to start (a symlinked audit log or token, ...): the message says why."""


RESTART_SETTINGS = (
    "socket",
    "ws",
    "auditLog",
    "auditMaxBytes",
    "auditKeep",
    "maxFrameBytes",
    "maxConnections",
    "logFormat",
    "telemetry",
    "quotaState",
    "zygote.enabled",
    "zygote.replyTimeoutMs",
)
"""``host`` settings read once when toolhost starts: a reload cannot apply a change to them."""


def needs_restart(old: HostConfig, new: HostConfig) -> list[str]:
    """The ``host.*`` settings of :data:`RESTART_SETTINGS` that differ between the two."""
    before, after = msgspec.to_builtins(old), msgspec.to_builtins(new)
    changed = []
    for name in RESTART_SETTINGS:
        a, b = before, after
        for part in name.split("."):
            a = a.get(part) if isinstance(a, dict) else None
            b = b.get(part) if isinstance(b, dict) else None
        if a != b:
            changed.append(f"host.{name}")
    return changed


class ReloadResult(msgspec.Struct, kw_only=True, rename="camel"):
    """What a registry reload did."""

    applied: bool
    revision: int
    added: list[str] = msgspec.field(default_factory=list)
    removed: list[str] = msgspec.field(default_factory=list)
    restarted: list[str] = msgspec.field(default_factory=list)
    unchanged: list[str] = msgspec.field(default_factory=list)
    errors: list[str] = msgspec.field(default_factory=list)
    needs_restart: list[str] = msgspec.field(default_factory=list)
    """``host`` settings that changed but apply only when toolhost restarts (still the old)."""

    def summary(self) -> str:
        if not self.applied:
            return "kept the running registry: " + "; ".join(self.errors)
        parts = [f"revision {self.revision}"]
        for name in ("added", "removed", "restarted"):
            items = getattr(self, name)
            if items:
                parts.append(f"{name} {', '.join(items)}")
        if self.errors:
            parts.append(f"{len(self.errors)} problem(s): " + "; ".join(self.errors))
        if self.needs_restart:
            parts.append(f"not applied until toolhost restarts: {', '.join(self.needs_restart)}")
        return ", ".join(parts)


def install_dirs() -> list[str]:
    """The host's installation: its packages and, in a virtual environment, the environment."""
    dirs = [os.path.dirname(supervisor.__file__)]
    spec = importlib.util.find_spec("sidecars")
    if spec is not None and spec.submodule_search_locations:
        dirs += list(spec.submodule_search_locations)
    if sys.prefix != sys.base_prefix:
        dirs.append(sys.prefix)
    # A source checkout (an editable install, `make serve`): its build and CI files run code
    # the next time the operator builds, tests or commits.
    checkout = os.path.dirname(os.path.dirname(os.path.abspath(supervisor.__file__)))
    if os.path.isfile(os.path.join(checkout, "pyproject.toml")):
        names = ("pyproject.toml", "Makefile", ".ci", ".git", "bench", "deploy")
        dirs += [os.path.join(checkout, name) for name in names]
    return dirs


class Host:
    """A running tool host."""

    def __init__(self, options: HostOptions) -> None:
        self.options = options
        self.app_root = os.path.abspath(options.app_root)
        self.version = supervisor.__version__
        self.catalog = CatalogState()
        self.registry: Registry = Registry(app_root=self.app_root)
        self.known = KnownCatalog()
        self.plan = Plan()
        self.pools: dict[str, Pool] = {}
        self.started_at = 0.0
        self.rng = random.Random(options.seed)
        self._nursery: trio.Nursery | None = None
        self._stop = trio.Event()
        self._stopped = trio.Event()
        self._reload_lock = trio.Lock()
        self._subscribers: set[trio.MemorySendChannel[CatalogChanged | None]] = set()
        self._on_change: list[Callable[[list[Descriptor]], None]] = []
        self._aliases: dict[str, str] = {}
        self.host_private: tuple[str, ...] = ()
        """Paths no tool may touch (PROTOCOL 1), sent to every worker in ``init``."""
        self.endpoints: dict[str, str] = {}
        self.started_host = self.registry.host
        """The ``host`` settings this run started with (a reload compares against them)."""
        self.audit: AuditLog | None = None
        self._pulse = trio.Event()
        self.upgrades = Upgrades(self)
        self.safeguards = Safeguards(self.catalog, self._changed, lambda: self.pools)
        self.quotas = self.safeguards.quotas
        self.invoker = Invoker(self.catalog, self.pools, self.quotas, self.safeguards.record)
        # Operator approval (calls/approvals.py): the setting and the token next to the socket.
        self.invoker.approvals.source = lambda: self.registry.host.approval_source
        self.invoker.approvals.token_file = lambda: token_path(
            self.options.socket
            or self.endpoints.get("unix")
            or self.registry.path(self.registry.host.socket)
        )
        self.tokens: dict[str, TokenFile] = {}
        """Tokens read at start and again at every reload, never per use (the operator's, the
        gateway's); a change is written to the audit log."""
        self.services = HostServices(
            self.invoker,
            self.app_root,
            sidecar_config=self._running_config,
            manifest=self._manifest_of,
            count_request=self.safeguards.accounting.count_request,
        )
        self.zygote: zygote.Zygote | None = None
        self.spawner = Spawner()
        """How workers start: exec, or from :attr:`zygote` once it runs (handed to every worker in
        its launch spec)."""
        self.telemetry: Tracing | None = None
        """OpenTelemetry spans and metrics (docs/telemetry.md); None when off."""
        self.stderr_lines: StderrLines | None = None
        """JSON logs: sidecar stderr lines forwarded as records; None with text logs."""
        # Operator events (events.subscribe): the call path is hooked only while watched.
        self.events = EventBus(lambda: list(self.pools.values()))
        self.events.on_calls = partial(setattr, self.invoker.engine, "events")

    @property
    def registry_path(self) -> str | None:
        """The registry file the options name (None: ``<appRoot>/tools/external.tools.jsonc``)."""
        return self.options.registry_path

    # loading -----------------------------------------------------------------------------

    def load(self) -> Plan:
        """Read registry and manifests and build a plan (does not apply it)."""
        opts = self.options
        self.registry = load_registry(
            self.app_root,
            registry_path=opts.registry_path,
            global_path=opts.global_registry,
            use_global=opts.use_global,
        )
        dirs = (
            [Path(d) for d in opts.manifest_dirs]
            if opts.manifest_dirs is not None
            else [
                bundled_manifest_dir(),
                Path(self.app_root) / "manifests",
            ]
        )
        self.known = load_known_catalog(dirs)
        try:
            os.makedirs(self.registry.project_dir, exist_ok=True)
        except OSError as exc:
            log.warning("projectDir %s cannot be created: %s", self.registry.project_dir, exc)
        self.host_private = self.registry.host_private(
            [str(d) for d in dirs],
            install_dirs(),
        )
        plan = build_plan(self.registry, self.known, host_version=self.version)
        if self.registry.autodiscover:
            self.registry.errors += add_discovered(
                plan, self.registry, self.known, scan_all(self.registry), host_version=self.version
            )
        for problem in every_problem(self.registry, self.known):
            log.warning("registry: %s", problem)
        return plan

    # lifecycle ---------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[Host] = trio.TASK_STATUS_IGNORED) -> None:
        """Start every runnable sidecar and serve until :meth:`stop`."""
        self.started_at = trio.current_time()
        await self.upgrades.recover()  # an interrupted package apply/rollback, before reading
        self.plan = self.load()
        self.started_host = self.registry.host
        self.catalog.allow_degraded = self.registry.host.allow_degraded
        self.upgrades.refresh()
        self._changed(self.catalog.load(self.plan))
        hcfg = self.registry.host
        self.safeguards.configure(self.registry, self.plan, first=True)
        self._start_telemetry()
        if hcfg.audit_log and self.options.audit:
            self.audit = AuditLog(
                self.registry.path(hcfg.audit_log),
                max_bytes=hcfg.audit_max_bytes,
                keep=hcfg.audit_keep,
            )
            self.invoker.audit = self.audit
        try:
            self._open_private_files()
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                if self.audit is not None:
                    await nursery.start(self.audit.run)
                await nursery.start(self.invoker.run_timers)
                await nursery.start(self.services.run)
                await self.safeguards.start(nursery)
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
            for ch in list(self._subscribers):
                ch.close()
            self._subscribers.clear()
            await self._stop_telemetry()
            self._stopped.set()

    def _open_private_files(self) -> None:
        """The audit log and the operator token, opened at start (private_files.py).

        Raises:
            HostStartError: One is a symlink, another user's, or cannot be read or created.
        """
        try:
            if self.audit is not None:
                self.audit.open()
            if self.registry.host.approval_source == "operator":
                self.invoker.approvals.load_token()
        except (OSError, ValueError) as exc:
            raise HostStartError(f"cannot start: {exc}") from exc
        if self.invoker.approvals.token is not None:
            self.tokens["operator"] = self.invoker.approvals.token

    def _reload_tokens(self) -> list[str]:
        """Read every token again (reload); a changed one is logged and audited."""
        errors: list[str] = []
        approvals = self.invoker.approvals
        first = self.registry.host.approval_source == "operator" and "operator" not in self.tokens
        if first:  # operator approval turned on by this reload: read it for the first time
            try:
                approvals.load_token()
            except (OSError, ValueError) as exc:
                errors.append(f"operator token: {exc}")
            if approvals.token is not None:
                self.tokens["operator"] = approvals.token
        for name, token in self.tokens.items():
            if first and name == "operator":
                continue
            try:
                changed = token.load()
            except (OSError, ValueError) as exc:
                errors.append(f"{name} token: {exc}; the one read before stays in force")
                continue
            if changed:
                log.warning("the %s token in %s changed; the new one is in force", name, token.path)
                if self.audit is not None:
                    self.audit.event("token-changed", token=name, path=token.path)
        return errors

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

    def _start_telemetry(self) -> None:
        """OpenTelemetry per ``host.telemetry`` and sidecar stderr forwarding per the log
        format (read once per run; a reload keeps them)."""
        if (self.options.log_format or self.registry.host.log_format) == "json":
            self.stderr_lines = StderrLines()
        tcfg = self.registry.host.telemetry
        tel = telemetry.start(tcfg.enabled, capture_content=tcfg.capture_content)
        if tel is None:
            return
        tel.redact = self.services.redactor.text
        tel.metering.queue_depth = lambda: [
            (sid, pool.dispatch.queued) for sid, pool in list(self.pools.items())
        ]
        self.telemetry = self.invoker.telemetry = tel

    async def _stop_telemetry(self) -> None:
        """Flush what is left, bounded: a collector that is down must not hold the stop."""
        tel, self.telemetry = self.telemetry, None
        self.invoker.telemetry = None
        if tel is None:
            return
        with trio.CancelScope(shield=True), trio.move_on_after(5):
            await trio.to_thread.run_sync(tel.shutdown, abandon_on_cancel=True)

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
            on_change=self._notify,
        )
        await nursery.start(self.zygote.run)
        self.spawner = Spawner(self.zygote)

    def stop(self) -> None:
        """Ask :meth:`run` to stop every sidecar gracefully and return."""
        self._stop.set()

    async def wait_stopped(self) -> None:
        """Return once :meth:`run` has stopped every sidecar."""
        await self._stopped.wait()

    async def reload(self) -> ReloadResult:
        """Re-read the registry; restart only sidecars whose entry changed.

        Sidecars whose entry is unchanged keep serving without a dropped call. A file that cannot
        be parsed keeps everything as it was; a sidecar whose new entry is invalid keeps running
        its previous configuration. Either way the reasons are reported.
        """
        async with self._reload_lock:
            old_registry, old_known, old_plan = self.registry, self.known, self.plan
            new_plan = self.load()
            if self.registry.unreadable:
                errors = list(self.registry.errors)
                self.registry, self.known = old_registry, old_known
                return ReloadResult(applied=False, revision=self.catalog.revision, errors=errors)
            result = ReloadResult(
                applied=True,
                revision=0,
                errors=list(self.registry.errors),
                needs_restart=needs_restart(self.started_host, self.registry.host),
            )
            if result.needs_restart:
                log.warning(
                    "reload: %s changed; a reload cannot apply that: the host keeps serving "
                    "with the old value until toolhost restarts",
                    ", ".join(result.needs_restart),
                )
            for sid, sp in list(new_plan.sidecars.items()):
                old = old_plan.sidecars.get(sid)
                if (
                    sp.config is None
                    and old is not None
                    and old.config is not None
                    and sid in self.pools
                ):
                    msg = (
                        f"sidecars.{sid}: new entry invalid ({'; '.join(sp.entry.errors)}); "
                        "still running the previous configuration"
                    )
                    result.errors.append(msg)
                    old.entry.warnings = [msg]
                    new_plan.sidecars[sid] = old
                    for tool, tp in old_plan.tools.items():
                        if tp.sidecar == sid:
                            new_plan.tools[tool] = tp
            stop: list[str] = []
            start: list[str] = []
            for sid in sorted(set(old_plan.sidecars) | set(new_plan.sidecars)):
                old, new = old_plan.sidecars.get(sid), new_plan.sidecars.get(sid)
                if new is None:
                    result.removed.append(sid)
                    stop.append(sid)
                elif old is None:
                    result.added.append(sid)
                    start.append(sid)
                elif old.fingerprint != new.fingerprint or old.argv != new.argv:
                    result.restarted.append(sid)
                    stop.append(sid)
                    start.append(sid)
                else:
                    result.unchanged.append(sid)
                    new_plan.sidecars[sid] = old if old is not new and sid in self.pools else new
            async with trio.open_nursery() as nursery:
                for sid in stop:
                    pool = self.pools.pop(sid, None)
                    if pool is not None:
                        nursery.start_soon(partial(pool.stop, drain_s=self._grace_s()))
            self.plan = new_plan
            self._changed(
                self.catalog.load(
                    new_plan, allow_degraded=self.registry.host.allow_degraded, reset=set(stop)
                )
            )
            self.safeguards.configure(self.registry, new_plan)
            result.errors += self._reload_tokens()
            if self.zygote is not None:  # no worker may start from stale preloaded code
                self.zygote.preload = zygote.preload_list(self.registry.host.zygote.preload)
                self.zygote.replace()
            for sid in result.unchanged:
                pool = self.pools.get(sid)
                if pool is not None:
                    self.on_facts(sid, pool.facts())
            for sid in start:
                await self._start_pool(new_plan.sidecars[sid])
            result.revision = self.catalog.revision
            return result

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
        if not sp.runnable or sp.config is None:
            return

        def publish(sidecar: str, facts: SidecarFacts) -> None:
            # A pool a reload replaced may still publish (its last "stopped", late): only the
            # pool serving the sidecar now (or none) speaks for it.
            if self.pools.get(sidecar, pool) is pool:
                self.on_facts(sidecar, facts)

        pool = Pool(
            launch.child_spec(sp, self._launch_context, restart_policy=self.options.restart_policy),
            Collaborators(
                publish=publish,
                notify=self._notify,
                guard=self.safeguards.guard,
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

    def _running_config(self, sidecar: str) -> SidecarConfig | None:
        pool = self.pools.get(sidecar)
        if pool is not None:
            return pool.config
        sp = self.plan.sidecars.get(sidecar)
        return sp.config if sp is not None else None

    def _manifest_of(self, tool: str) -> ToolManifest | None:
        tp = self.catalog.tool_plan(tool)
        return tp.manifest if tp is not None else None

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
        )

    # facts and subscriptions ---------------------------------------------------------------

    def on_facts(self, sidecar: str, facts: SidecarFacts) -> None:
        revision = self.catalog.revision
        changed = self.catalog.update_sidecar(sidecar, facts)
        if not changed and self.catalog.revision != revision:
            # Only removals (a tool the sidecar stopped announcing): tell subscribers to re-read.
            self._changed([], force=True)
        else:
            self._changed(changed)

    def set_upgrade(
        self, sidecar: str, state: UpgradeField | None, reason: Reason | None = None
    ) -> None:
        """Show the package manager's ``upgrade`` state for ``sidecar`` (None: the registry's)."""
        self._changed(self.catalog.set_upgrade(sidecar, state, reason))

    def _notify(self) -> None:
        self._pulse.set()
        self._pulse = trio.Event()

    async def wait_change(self) -> None:
        """Return at the next state change of any pool or of the catalog (for tests and tools
        that watch the host in-process)."""
        await self._pulse.wait()

    def _changed(self, changed: list[Descriptor], *, force: bool = False) -> None:
        removed = self.catalog.take_removed()
        if not changed and not removed and not force:
            return
        self._notify()
        for d in changed:
            alias = provider_name(d.name)
            if alias != d.name:
                self._aliases[alias] = d.name
        event = CatalogChanged(revision=self.catalog.revision, tools=changed, removed=removed)
        for ch in list(self._subscribers):
            try:
                ch.send_nowait(event)
            except trio.WouldBlock:
                # A subscriber that cannot keep up is dropped; it may subscribe again.
                self._subscribers.discard(ch)
                ch.close()
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                self._subscribers.discard(ch)
        for cb in self._on_change:
            cb(changed)

    def subscribe(self) -> trio.MemoryReceiveChannel[CatalogChanged | None]:
        """A channel of ``catalog.changed`` events (closed if the reader falls behind)."""
        send, recv = trio.open_memory_channel[CatalogChanged | None](SUBSCRIBER_BUFFER)
        self._subscribers.add(send)
        return recv

    # reading -----------------------------------------------------------------------------

    def catalog_snapshot(self) -> Catalog:
        return Catalog(
            revision=self.catalog.revision,
            tools=self.catalog.tools(),
            sidecars=self.sidecar_statuses(),
            zygote=self.zygote.status() if self.zygote is not None else None,
            registry=RegistryStatus(
                files=list(self.registry.files),
                errors=[*self.registry.errors, *self.known.errors],
            ),
        )

    def sidecar_statuses(self) -> list[SidecarStatus]:
        out = []
        for sid, sp in sorted(self.plan.sidecars.items()):
            pool = self.pools.get(sid)
            if pool is not None:
                status = pool.status()
                if sp.entry.warnings:
                    status = msgspec.structs.replace(status, errors=list(sp.entry.warnings))
                if sp.announces:
                    # A folder's tools are what the catalog gives it: a multi-tool script's
                    # file name is no tool once the script listed its tools.
                    owned = sorted(d.name for d in self.catalog.tools() if d.sidecar == sid)
                    status = msgspec.structs.replace(status, tools=owned)
                out.append(status)
                continue
            cfg = sp.config
            facts_reason = self.catalog_reason(sid)
            out.append(
                SidecarStatus(
                    id=sid,
                    protocol=cfg.protocol if cfg else "?",
                    mode=cfg.mode if cfg else "?",
                    enabled=cfg.enabled if cfg else False,
                    manifest="valid" if cfg else "invalid",
                    runtime="stopped" if (cfg and not cfg.enabled) else "failed",
                    tools=list(sp.entry.tools),
                    errors=[*sp.entry.errors, *sp.entry.warnings]
                    + ([sp.problem] if sp.problem and sp.problem not in sp.entry.errors else [])
                    + ([facts_reason] if facts_reason else []),
                )
            )
        return out

    def catalog_reason(self, sidecar: str) -> str | None:
        for d in self.catalog.tools():
            if d.sidecar == sidecar:
                for r in d.stability.reasons:
                    if r.field == "runtime":
                        return r.message
        return None

    def health(self) -> HealthResult:
        counts = HealthCounts()
        tools = HealthCounts()
        by_sidecar: dict[str, list[str]] = {}
        critical: dict[str, str] = {}
        for d in self.catalog.tools():
            eff = d.stability.effective
            setattr(tools, eff, getattr(tools, eff) + 1)
            if d.sidecar is not None:
                by_sidecar.setdefault(d.sidecar, []).append(eff)
        for sid, sp in self.plan.sidecars.items():
            effs = by_sidecar.get(sid, [])
            cfg = sp.config
            if cfg is not None and not cfg.enabled:
                state = "disabled"
            elif not effs:
                pool = self.pools.get(sid)
                ok = pool is not None and pool.facts().runtime == "ready"
                state = "available" if ok else "unavailable"
            elif all(e == "available" for e in effs):
                state = "available"
            elif all(e in ("unavailable", "disabled") for e in effs):
                state = "unavailable"
            else:
                state = "degraded"
            setattr(counts, state, getattr(counts, state) + 1)
            if cfg is not None and cfg.critical:
                critical[sid] = state
        status: Literal["ok", "degraded"] = (
            "ok" if counts.unavailable == 0 and counts.degraded == 0 else "degraded"
        )
        return HealthResult(
            status=status,
            uptimeMs=round((trio.current_time() - self.started_at) * 1000.0, 1),
            sidecars=counts,
            tools=tools,
            ready=all(state == "available" for state in critical.values()),
            critical=critical,
        )

    # invoking ----------------------------------------------------------------------------

    async def invoke(
        self,
        tool: str,
        input_raw: msgspec.Raw = wire.EMPTY_OBJECT,
        *,
        timeout_ms: int | None = None,
        approval: Approval | None = None,
        on_progress: ProgressSink | None = None,
        call_key: Any = None,
        client: str = "",
        session: str | None = None,
    ) -> Envelope:
        """Run one tool call to exactly one envelope (in-process callers; the server uses
        :meth:`start_invoke`). Cancelling the caller cancels the call.

        Args:
            tool: Tool name.
            input_raw: The input object as raw JSON.
            timeout_ms: Deadline override (else the manifest's, else the sidecar's).
            approval: The kernel's approval for approval-required tools.
            on_progress: Receives progress payloads (raw JSON).
            call_key: Key under which :meth:`cancel` can find this call.
            client: Who asked (for the audit log).
        """
        done = trio.Event()
        box: list[Envelope] = []

        def on_done(env: Envelope) -> None:
            box.append(env)
            done.set()

        key = call_key if call_key is not None else object()
        self.start_invoke(
            tool,
            input_raw,
            timeout_ms=timeout_ms,
            approval=approval,
            on_progress=on_progress,
            call_key=key,
            client=client,
            on_done=on_done,
            session=session,
        )
        try:
            await done.wait()
        except trio.Cancelled:
            self.invoker.cancel(key, "client disconnected")
            raise
        return box[0]

    def start_invoke(
        self,
        tool: str,
        input_raw: msgspec.Raw,
        *,
        timeout_ms: int | None,
        approval: Approval | None,
        on_progress: ProgressSink | None,
        call_key: Any,
        client: str,
        on_done: Callable[[Envelope], None],
        session: str | None = None,
        trace: Any = None,
    ) -> None:
        """Start one tool call without awaiting it; ``on_done`` gets its one envelope (see
        :mod:`supervisor.calls.invoke`; ``trace``: the OpenTelemetry context its span
        joins)."""
        self.invoker.start(
            tool,
            input_raw,
            timeout_ms=timeout_ms,
            approval=approval,
            on_progress=on_progress,
            call_key=call_key,
            client=client,
            on_done=on_done,
            session=session,
            trace=trace,
        )

    def resolve_name(self, name: str) -> str:
        """Map a provider-safe name (``file__hash``) back to the tool name (``file.hash``)."""
        if self.catalog.get(name) is not None:
            return name
        return self._aliases.get(name, name)

    def stats(self) -> StatsResult:
        """Accounting per sidecar, tool and worker (``system.stats``)."""
        return self.safeguards.stats((trio.current_time() - self.started_at) * 1000.0)

    def cancel(self, call_key: Any, message: str = "") -> bool:
        """Cancel a running call registered under ``call_key``."""
        return self.invoker.cancel(call_key, message)

    async def restart_sidecar(self, sidecar: str) -> bool:
        pool = self.pools.get(sidecar)
        if pool is None:
            return False
        await pool.restart()
        return True
