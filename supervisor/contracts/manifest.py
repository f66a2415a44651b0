"""Tool manifests: the known catalog in ``manifests/*.toml`` (PROTOCOL 2)."""

from __future__ import annotations

from typing import Any, Literal

import msgspec
from msgspec import Struct

from supervisor.contracts.registry import PositiveInt, SandboxValue, StateDecl, ToolName

Permission = Literal["read", "write", "execute", "network", "message", "computer"]


class RetryConfig(Struct, forbid_unknown_fields=True, rename="camel", kw_only=True):
    """``retry = {maxAttempts, backoffMs}``; honoured for ``readOnly`` tools only."""

    max_attempts: PositiveInt = 1
    backoff_ms: int = 0


class ToolManifest(Struct, forbid_unknown_fields=True, rename="camel", kw_only=True):
    """One ``[[tool]]`` table."""

    name: ToolName
    description: str = ""
    input_schema: dict[str, Any] = msgspec.field(default_factory=lambda: {"type": "object"})
    output_schema: dict[str, Any] | None = None
    read_only: bool = False
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
    how to register a bundled sidecar without importing its code.
    """

    sidecar: str | None = None
    install: str | None = None
    run: RunRecipe | None = None
    tool: list[ToolManifest] = msgspec.field(default_factory=list)
