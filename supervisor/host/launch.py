"""Which worker runs a sidecar, and how its pool is shaped, by ``protocol`` and ``mode``.

| protocol / mode           | worker              | pool                                          |
|---------------------------|---------------------|-----------------------------------------------|
| process-json persistent   | ProcessWorker       | as configured                                 |
| mcp                       | McpWorker           | as configured; ``MCP_CONCURRENCY`` calls each |
| mcp-http                  | McpHttpWorker       | as configured; ``MCP_CONCURRENCY`` calls each |
| process-json oneshot      | OneshotWorker       | one call site running up to ``pool.max``      |
| simple-json               | SimpleJsonWorker    | one call site running up to ``pool.max``      |

Per-call protocols have no process to ping: their pool runs with ``probe.intervalMs = 0`` so
the snapshot says ``probe: skipped`` (simple-json reports its discovery probe per tool).
"""

from __future__ import annotations

from typing import Any

import msgspec

from supervisor.contracts.registry import SidecarConfig
from supervisor.host.vault import Vault, VaultError
from supervisor.pools.pool import WorkerFactory
from supervisor.protocols.mcp_http import resolve_headers
from supervisor.workers.base import LaunchSpec, Worker, WorkerHooks
from supervisor.workers.mcp import McpWorker
from supervisor.workers.mcp_http import McpHttpWorker
from supervisor.workers.oneshot import OneshotWorker
from supervisor.workers.process_json import ProcessWorker
from supervisor.workers.simple_json import SimpleJsonWorker

MCP_CONCURRENCY = 8
"""Calls in flight per MCP server process (JSON-RPC multiplexes; the registry has no knob)."""


def is_per_call(cfg: SidecarConfig) -> bool:
    """True for protocols that spawn one process per call."""
    return cfg.protocol == "simple-json" or (
        cfg.protocol == "process-json" and cfg.mode == "oneshot"
    )


def worker_factory(cfg: SidecarConfig) -> WorkerFactory:
    """The worker class for a sidecar's protocol and mode."""
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
        return cls(spec, hooks, index)

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
