"""A sidecar's child spec: which worker runs it, how its pool is shaped, how a worker launches.

| protocol / mode           | worker              | pool                                          |
|---------------------------|---------------------|-----------------------------------------------|
| process-json persistent   | ProcessWorker       | as configured                                 |
| mcp                       | McpWorker           | as configured; ``MCP_CONCURRENCY`` calls each |
| mcp-http                  | McpHttpWorker       | as configured; ``MCP_CONCURRENCY`` calls each |
| process-json oneshot      | OneshotWorker       | one call site running up to ``pool.max``      |
| simple-json               | SimpleJsonWorker    | one call site running up to ``pool.max``      |

Per-call protocols have no process to ping: their pool runs with ``probe.intervalMs = 0`` so
the snapshot says ``probe: skipped`` (simple-json reports its discovery probe per tool).

# Strategy: :func:`child_spec` turns a sidecar's plan into the one input of its pool's keeper
# (``pools/spec.py``): the worker factory, the pool-shaped configuration and a launch callable
# that builds a fresh :class:`~supervisor.workers.base.LaunchSpec` (:func:`launch_spec`) at
# every worker start. What a launch takes from the host (the project and host-private paths a
# reload may change, telemetry, grace periods, the vault) comes from a
# :class:`LaunchContext` the host hands over as a callable, read at each start too, so an
# unchanged sidecar restarting after a reload gets the new paths. This module imports
# ``host/vault.py`` (its own layer, on purpose): an ``mcp-http`` sidecar's headers may name
# ``${vault:KEY}``, and those are resolved here, at every start, so ``toolhost vault set``
# applies to the next session without a reload; a key that is not set becomes the launch
# spec's ``problem`` (the worker fails to start with that message).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import msgspec

from supervisor import telemetry
from supervisor.contracts import wire
from supervisor.contracts.registry import SidecarConfig
from supervisor.host.confinement import Confiner
from supervisor.host.vault import Vault, VaultError
from supervisor.policy.spawn import eligible
from supervisor.pools.spec import ChildSpec, WorkerFactory
from supervisor.processes import limits
from supervisor.processes.spawn import Spawner, allowed_env
from supervisor.protocols.mcp_http import resolve_headers
from supervisor.registry.plan import SidecarPlan
from supervisor.workers.base import LaunchSpec, Worker, WorkerHooks
from supervisor.workers.mcp import McpWorker
from supervisor.workers.mcp_client import McpClient
from supervisor.workers.mcp_http import McpHttpWorker
from supervisor.workers.oneshot import OneshotWorker
from supervisor.workers.process_json import ProcessWorker
from supervisor.workers.simple_json import SimpleJsonWorker

MCP_CONCURRENCY = 8
"""Calls in flight per MCP server process (JSON-RPC multiplexes; the registry has no knob)."""


AttachMcp = Callable[[str, McpClient], None]
"""Wires a new MCP worker's session (sidecar id, session) to the host."""


def is_per_call(cfg: SidecarConfig) -> bool:
    """True for protocols that spawn one process per call."""
    return cfg.protocol == "simple-json" or (
        cfg.protocol == "process-json" and cfg.mode == "oneshot"
    )


def worker_factory(cfg: SidecarConfig, attach: AttachMcp | None = None) -> WorkerFactory:
    """The worker class for a sidecar's protocol and mode; ``attach`` wires the MCP session of
    each new MCP worker to the host (subscriptions, list changes) before it starts."""
    cls: type[Worker]
    if cfg.protocol == "mcp":
        cls = McpWorker
    elif cfg.protocol == "mcp-http":
        cls = McpHttpWorker
    elif cfg.protocol == "simple-json":
        cls = SimpleJsonWorker
    elif cfg.mode == "oneshot":
        cls = OneshotWorker
    else:
        cls = ProcessWorker

    def make(spec: LaunchSpec, hooks: WorkerHooks, index: int) -> Worker:
        worker = cls(spec, hooks, index)
        if attach is not None and isinstance(worker, McpWorker | McpHttpWorker):
            attach(spec.sidecar, worker.mcp)
        return worker

    return make


def pool_config(cfg: SidecarConfig) -> SidecarConfig:
    """The configuration the pool runs with (per-call protocols: one call site, no pings)."""
    if not is_per_call(cfg):
        return cfg
    return msgspec.structs.replace(
        cfg,
        pool=msgspec.structs.replace(cfg.pool, min=1, max=1, max_calls_per_worker=0),
        probe=msgspec.structs.replace(cfg.probe, interval_ms=0),
    )


def concurrency(cfg: SidecarConfig) -> int:
    """Calls in flight per worker where the protocol does not announce it."""
    if is_per_call(cfg):
        return cfg.pool.max
    if cfg.protocol in ("mcp", "mcp-http"):
        return MCP_CONCURRENCY
    return 1


def remote_config(cfg: SidecarConfig, vault: Vault) -> tuple[dict[str, Any], str | None]:
    """The ``config`` a worker gets: for ``mcp-http``, ``${vault:KEY}`` in ``config.headers``
    replaced by the vault's value (read at every connection, so ``toolhost vault set`` applies
    to the next session), and why not when a key is not set or the vault cannot be read."""
    if cfg.protocol != "mcp-http":
        return cfg.config, None
    scopes: dict[str, list[str]] = {d.key: [str(s) for s in d.scopes] for d in cfg.vault}

    def lookup(key: str) -> str | None:
        try:
            return vault.get(key, scopes.get(key, ["shared"]))
        except VaultError as exc:
            raise ValueError(exc.message) from exc

    return resolve_headers(cfg.config, lookup)


class LaunchContext(msgspec.Struct, frozen=True, kw_only=True):
    """What every worker's launch spec takes from its host, read at each start."""

    project_dir: str
    """The registry's ``projectDir`` (a reload may change it)."""
    host_private: tuple[str, ...]
    """Paths no tool may touch (PROTOCOL 1), sent in ``init`` (a reload may change them)."""
    vault: Vault
    """Resolves ``${vault:KEY}`` in ``mcp-http`` headers."""
    telemetry: bool
    """OpenTelemetry is on: the sidecar's SDK exports its spans to the same place."""
    cancel_grace_ms: int
    stop_grace_ms: int
    spawner: Spawner
    """How workers start: exec'd, or forked by the host's zygote once it runs."""
    confiner: Confiner | None = None
    """Each sidecar's walls for this registry load (PROTOCOL 7; None: none)."""


def child_spec(
    sp: SidecarPlan,
    context: Callable[[], LaunchContext],
    *,
    restart_policy: str | None = None,
    attach: AttachMcp | None = None,
) -> ChildSpec:
    """What the pool of ``sp`` (a runnable sidecar) starts and restarts.

    Args:
        sp: The sidecar's plan (``config`` set).
        context: The host's part of each launch, read at every worker start.
        restart_policy: Overrides the sidecar's ``restart.policy`` (``toolhost doctor``
            starts each sidecar once).
        attach: Wires each new MCP worker's session to the host (``HostedOffers.attach``).
    """
    cfg = sp.config
    assert cfg is not None
    run = cfg
    if restart_policy is not None:
        run = msgspec.structs.replace(
            cfg, restart=msgspec.structs.replace(cfg.restart, policy=restart_policy)
        )

    def launch() -> LaunchSpec:
        return launch_spec(sp, context())

    return ChildSpec(
        sidecar=sp.id,
        config=pool_config(run),
        launch=launch,
        factory=worker_factory(cfg, attach),
        declared_tools=tuple(sp.entry.tools),
    )


def launch_spec(sp: SidecarPlan, ctx: LaunchContext) -> LaunchSpec:
    """The spawn recipe for one worker of ``sp``."""
    cfg = sp.config
    assert cfg is not None
    extra = {**cfg.env, "TOOLHOST_SIDECAR": sp.id, "TOOLHOST_PROTOCOL": cfg.protocol}
    if ctx.telemetry:  # the sidecar's SDK exports its spans to the same place
        extra = {**telemetry.sidecar_env(), "OTEL_SERVICE_NAME": sp.id, **extra}
    env = allowed_env(os.environ, extra)
    config, problem = remote_config(cfg, ctx.vault)
    init = wire.Init(
        sidecar=sp.id,
        config=config,
        projectDir=ctx.project_dir,
        hostPrivate=list(ctx.host_private),
        configDir=sp.entry.config_dir,
        cwd=sp.cwd,
    )
    return LaunchSpec(
        sidecar=sp.id,
        argv=list(sp.argv),
        cwd=sp.cwd,
        env=env,
        init=init,
        start_timeout_s=cfg.probe.start_timeout_ms / 1000.0,
        probe_timeout_s=cfg.probe.timeout_ms / 1000.0,
        initial_probe=cfg.probe.interval_ms > 0,
        cancel_grace_s=ctx.cancel_grace_ms / 1000.0,
        stop_grace_s=ctx.stop_grace_ms / 1000.0,
        concurrency=concurrency(cfg),
        scripts=_scripts(sp, cfg),
        routes=dict(sp.routes),
        announces=sp.announces,
        max_line=limits.line_limit(cfg),
        limits=limits.for_worker(cfg, per_call=is_per_call(cfg)),
        spawn="auto"
        if eligible(cfg.protocol, cfg.mode, cfg.spawn, cfg.command or "", cfg.args)
        else "exec",
        spawner=ctx.spawner,
        problem=problem,
        confine=ctx.confiner.get(sp.id) if ctx.confiner is not None else None,
        explain=ctx.confiner.explainer(sp.id) if ctx.confiner is not None else None,
    )


def _scripts(sp: SidecarPlan, cfg: SidecarConfig) -> dict[str, list[str]]:
    """simple-json: the script behind each tool (a registry entry's command serves all of its
    tools, or one tool named after the sidecar)."""
    if cfg.protocol != "simple-json":
        return {}
    if sp.scripts or sp.routes:
        return {tool: list(argv) for tool, argv in sp.scripts.items()}
    return {tool: list(sp.argv) for tool in (sp.entry.tools or [sp.id])}
