"""External tool packages: the ``package.toml`` file and the ``packages.*`` kernel methods.

``package.toml`` is a config file (strict: unknown keys are errors naming the key, camelCase on
disk like the registry). The kernel method params are tolerant like every other request; results
are what ``toolhost pkg status --json`` prints too.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta, Struct

from supervisor.contracts.registry import Mode, ToolName
from supervisor.contracts.snapshot import UpgradeField

PACKAGE_ID_PATTERN = r"^[a-z0-9][a-z0-9._-]{0,63}$"
VERSION_PATTERN = r"^[0-9]+(\.[0-9]+)*([-+][0-9A-Za-z.-]+)?$"
CHECKSUM_PATTERN = r"^sha256:[0-9a-f]{64}$"

PackageId = Annotated[str, Meta(pattern=PACKAGE_ID_PATTERN)]
PackageVersion = Annotated[str, Meta(pattern=VERSION_PATTERN, max_length=64)]


class PackageFile(Struct, forbid_unknown_fields=True, rename="camel", kw_only=True):
    """``package.toml`` at the root of a package folder (or ``.tar.gz``).

    ``command`` is relative to the package (``bin/greet``) or a bare PATH name (``python``);
    ``args`` may use ``{package}`` for the installed folder. ``defaults`` holds registry-entry
    settings (``timeoutMs``, ``pool``, ``probe``, ``restart``, ``env``, ``config``, ...) used
    where the operator's entry has none. ``checksum`` covers every payload file (everything but
    ``package.toml``), see ``docs/packages.md``.
    """

    id: PackageId
    version: PackageVersion
    kind: Literal["process-json"]
    protocol: Annotated[str, Meta(pattern=r"^[0-9]+(\.[0-9]+)*$")]
    command: Annotated[str, Meta(min_length=1)]
    tools: Annotated[list[ToolName], Meta(min_length=1)]
    compatible_core: Annotated[str, Meta(min_length=1)]
    checksum: Annotated[str, Meta(pattern=CHECKSUM_PATTERN)]
    mode: Mode = "persistent"
    args: list[str] = msgspec.field(default_factory=list)
    description: str = ""
    defaults: dict[str, Any] = msgspec.field(default_factory=dict)


# packages.* params -------------------------------------------------------------------------


class StageParams(Struct, kw_only=True):
    """``packages.stage``: a package folder or ``.tar.gz``; relative to the app root."""

    source: str


class ApplyParams(Struct, kw_only=True):
    """``packages.apply``: apply the staged version of ``id``."""

    id: str
    autoRollback: bool = False


class RollbackParams(Struct, kw_only=True):
    """``packages.rollback``: restore the previous version; an operator decision."""

    id: str
    confirm: bool = False


# packages.* results ------------------------------------------------------------------------


class PackageInfo(Struct, kw_only=True):
    """One package as ``packages.status`` reports it."""

    id: str
    upgrade: UpgradeField
    installed: str | None = None
    staged: str | None = None
    previous: str | None = None
    registryVersion: str | None = None
    tools: list[str] = msgspec.field(default_factory=list)
    message: str = ""
    problems: list[str] = msgspec.field(default_factory=list)


class TransactionInfo(Struct, kw_only=True):
    """An apply or rollback that has not finished (or not been recovered yet)."""

    op: Literal["apply", "rollback"]
    id: str
    fromVersion: str | None
    toVersion: str
    committed: bool


class PackagesStatus(Struct, kw_only=True):
    packages: list[PackageInfo]
    transaction: TransactionInfo | None = None
    recovered: list[str] = msgspec.field(default_factory=list)
    """What recovery did before this answer (empty when nothing was unfinished)."""


class StageResult(Struct, kw_only=True):
    id: str
    version: str
    staged: str
    """Where it was staged, relative to the app root."""
    upgrade: UpgradeField = "staged"
    installed: str | None = None
    replaced: str | None = None
    """A different version of the same package that was staged before and is now dropped."""


class ApplyResult(Struct, kw_only=True):
    """The outcome of ``packages.apply`` or ``packages.rollback``."""

    id: str
    op: Literal["apply", "rollback"]
    fromVersion: str | None
    toVersion: str
    upgrade: UpgradeField
    verified: bool
    """The host saw the new version ready (False when no host ran it yet, or it failed)."""
    rolledBack: bool = False
    """``autoRollback`` restored the previous version after a failed start or probe."""
    message: str = ""
