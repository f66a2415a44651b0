"""Tool manifests: the known catalog in ``manifests/*.toml`` (PROTOCOL 2)."""

from __future__ import annotations

from typing import Any, Literal

import msgspec
from msgspec import UNSET, Struct, UnsetType

from supervisor.contracts.registry import (
    ConfineConfig,
    PositiveInt,
    SandboxValue,
    StateDecl,
    ToolName,
)

Permission = Literal["read", "write", "execute", "network", "message", "computer"]


class RetryConfig(Struct, forbid_unknown_fields=True, rename="camel", kw_only=True):
    """``retry = {maxAttempts, backoffMs}``; honoured for ``readOnly`` tools only."""

    max_attempts: PositiveInt = 1
    backoff_ms: int = 0


class ToolManifest(Struct, forbid_unknown_fields=True, rename="camel", kw_only=True):
    """One ``[[tool]]`` table.

    ``description``, ``inputSchema``, ``outputSchema`` and ``readOnly``, when left out, come
    from what the serving sidecar announces (an MCP server's ``tools/list``, a ``ready``
    message), else from the defaults: ``""``, ``{"type": "object"}``, none, false. A manifest
    that sets only ``timeoutMs`` and ``retry`` must not erase the tool's description.
    """

    name: ToolName
    description: str | UnsetType = UNSET
    input_schema: dict[str, Any] | UnsetType = UNSET
    output_schema: dict[str, Any] | UnsetType = UNSET
    read_only: bool | UnsetType = UNSET
    concurrency_safe: bool = False
    exclusive: bool = False
    result_limit: PositiveInt | None = None
    permission: Permission | None = None
    sandbox: SandboxValue | None = None
    timeout_ms: PositiveInt | None = None
    retry: RetryConfig | None = None
    requires: list[ToolName] = msgspec.field(default_factory=list)
    state: list[StateDecl] = msgspec.field(default_factory=list)
    """Named stores this tool may use through ``state.*`` (PROTOCOL 3.5)."""


class RunRecipe(Struct, forbid_unknown_fields=True, kw_only=True):
    """How ``toolhost init`` registers a bundled sidecar (portable: relative or PATH command)."""

    command: str
    args: list[str] = msgspec.field(default_factory=list)
    cwd: str = "app"


class ManifestFile(Struct, forbid_unknown_fields=True, kw_only=True):
    """A ``manifests/<family>.toml`` file.

    ``sidecar`` names the sidecar id that usually serves the family, ``install`` is a human hint
    shown for tools nobody serves (``discovery: missing``), and ``run`` tells ``toolhost init``
    how to register a bundled sidecar without importing its code. ``confine`` is the family's
    default confinement profile (PROTOCOL 7): it applies to a sidecar that runs the family's
    ``run`` recipe (the bundled code it was written for), key by key under the entry's own.
    """

    sidecar: str | None = None
    install: str | None = None
    run: RunRecipe | None = None
    confine: ConfineConfig | None = None
    tool: list[ToolManifest] = msgspec.field(default_factory=list)
