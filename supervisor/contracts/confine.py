"""Confinement shapes (PROTOCOL 7): what the kernel can do, the plan for one sidecar, and the
facts read back from a running worker.

The profile an operator writes is :class:`supervisor.contracts.registry.ConfineConfig`; the pure
resolver (:mod:`supervisor.policy.confine`) turns it, the host's layout and the
:class:`KernelFacts` into a :class:`ConfinePlan`; the spawn path applies the plan between fork
and exec (:mod:`supervisor.processes.walls`) and reads back :class:`ConfinementFacts` for the
snapshot's ``stability.details.confinement``.
"""

from __future__ import annotations

from typing import Literal

import msgspec
from msgspec import Struct

from supervisor.contracts.registry import (
    ConfinementMode,
    KeepScope,
    NetworkGrant,
    ProjectAccess,
)

NetnsWay = Literal["root", "user", ""]
"""How a worker gets a network namespace of its own: ``unshare(CLONE_NEWNET)`` as root, a user
namespace first as a normal user, or not at all (``""``)."""
SocketFilter = Literal["any", "stream", "none"]
"""Which ``socket()`` families and types the syscall filter lets through besides ``AF_UNIX``
(which has its own switch): ``any``; ``stream`` (TCP over IPv4/IPv6 only); ``none``."""
PidsWay = Literal["cgroup", "rlimit", "none"]


class KernelFacts(Struct, frozen=True, kw_only=True):
    """What this kernel, in this host's situation, can enforce (``processes.confine.probe``)."""

    landlock_abi: int = 0
    """The Landlock ABI version (0: no Landlock)."""
    seccomp: bool = False
    """Seccomp filters can be installed."""
    arch: str = ""
    """The architecture the syscall filter is built for (``x86_64``, ``aarch64``); empty when
    toolhost has no syscall table for this machine."""
    root: bool = False
    """The host runs as uid 0 (capabilities to drop; ``RLIMIT_NPROC`` does not bind)."""
    netns: NetnsWay = ""
    pids_cgroup: bool = False
    """A pids cgroup per worker can be made (a writable pids controller)."""


class Profile(Struct, frozen=True, kw_only=True):
    """A profile with every key decided (the entry's keys over the family's over the strict
    defaults)."""

    project: ProjectAccess = "read"
    read: tuple[str, ...] = ()
    write: tuple[str, ...] = ()
    network: Literal["none", "host"] | NetworkGrant = "none"
    unix: tuple[str, ...] = ()
    processes: int = 64
    keep: KeepScope = "worker"
    folders: tuple[str, ...] = ()
    """Project folders it writes by default (made at load where the project is carved)."""


class Layout(Struct, frozen=True, kw_only=True):
    """Where things are, absolute paths (the resolver's inputs besides the profile)."""

    app_root: str
    project_dir: str
    cwd: str
    """The worker's working directory (granted read)."""
    program: str = ""
    """The program's file or folder (its command, or the script or module its args name);
    its folder is granted read."""
    home: str = ""
    """``$HOME`` of the host; well-known secret folders under it are never granted."""
    install: tuple[str, ...] = ()
    """The interpreter, its standard library, the virtual environment and the toolhost
    package (read and execute)."""
    secrets: tuple[str, ...] = ()
    """Never read nor written: the host's state (``.toolhost/``, tokens, vault, audit, socket)
    and the registry files (``Registry.host_secrets``)."""
    host_private: tuple[str, ...] = ()
    """Never written: ``Registry.host_private`` (registry, manifests, ``tools/``, installation)."""


class ConfinePlan(Struct, frozen=True, kw_only=True):
    """What to enforce for one sidecar's workers, and how (built by ``policy.confine``).

    Path lists are final: already carved around every never-granted path, symlinks resolved.
    The worker's private ``TMPDIR`` is added per worker when the plan is applied.
    """

    sidecar: str
    mode: ConfinementMode
    read: tuple[str, ...] = ()
    """Read and execute (files or folders and everything below)."""
    write: tuple[str, ...] = ()
    """Read, execute, write, create, remove, rename (never device nodes)."""
    listed: tuple[str, ...] = ()
    """Listing alone (Landlock ``READ_DIR``): the top of a folder carved around the host's own
    files (``projectDir: "."``), whose entries ``read``/``write`` grant one by one."""
    never: tuple[str, ...] = ()
    """Paths no rule reaches (for reports and ``toolhost doctor``)."""
    refused: tuple[str, ...] = ()
    """Grants of the profile that were dropped, each with why (``.toolhost is host-private``)."""
    network: Literal["none", "proxy", "host"] = "none"
    allow: tuple[str, ...] = ()
    """Egress rules for the host's proxy (``policy.egress``)."""
    loopback: tuple[int, ...] = ()
    unix: tuple[str, ...] = ()
    processes: int = 64
    keep: KeepScope = "worker"
    """What the worker's leftover processes may outlive (``confine.keep``): with a pids
    cgroup, ``sidecar``/``host`` move them to the sidecar's kept group when the worker ends."""
    landlock_abi: int = 0
    """The Landlock ABI to build the ruleset for (0: no Landlock)."""
    netns: NetnsWay = ""
    tcp_connect: tuple[int, ...] | None = None
    """Landlock TCP rules (ABI 4) when no network namespace is possible: the only ports
    ``connect`` may reach besides the egress proxy's (added per worker, as only the spawn path
    knows it); ``bind`` is refused. ``None``: TCP is left to the namespace (or unconfined)."""
    socket_filter: SocketFilter = "any"
    allow_unix: bool = False
    """``socket(AF_UNIX)`` allowed (the profile grants ``unix`` paths); ``socketpair`` always is."""
    seccomp_arch: str = ""
    """The syscall filter's architecture (empty: no filter)."""
    drop_caps: bool = False
    pids: PidsWay = "none"
    proxy_port: int = 0
    """The port of the egress proxy's listener inside the worker's network namespace (0: none)."""
    missing: tuple[str, ...] = ()
    """What this kernel cannot enforce of the profile."""
    fixes: tuple[str, ...] = ()
    """One fix per distinct cause of ``missing``."""
    unavailable: str = ""
    """Non-empty with ``mode: required`` and something missing: the ``confinement-unavailable``
    reason (what is missing, and the fix); the sidecar must not start."""

    @property
    def active(self) -> bool:
        """Anything at all is applied (False for ``off``)."""
        return self.mode != "off"


class ConfinementFacts(Struct, frozen=True, kw_only=True, rename="camel"):
    """``stability.details.confinement``: the fact read from the running worker (PROTOCOL 7)."""

    mode: ConfinementMode
    filesystem: Literal["enforced", "partial", "none"] = "none"
    network: Literal["isolated", "proxy", "host"] = "host"
    syscalls: Literal["filtered", "none"] = "none"
    no_new_privs: bool = False
    missing: list[str] = msgspec.field(default_factory=list)


class EgressRecord(Struct, frozen=True, kw_only=True, rename="camel"):
    """One egress connection, allowed or refused: the audit line of PROTOCOL 7."""

    event: Literal["egress"] = "egress"
    sidecar: str
    host: str
    port: int
    allowed: bool
    rule: str
    """The rule that allowed it, or what refused it (``no-rule``, ``private-address``, ...)."""
    bytes_in: int = 0
    """Bytes from the destination to the sidecar."""
    bytes_out: int = 0
    """Bytes from the sidecar to the destination."""
    worker: str = ""
    method: str = ""
    """``CONNECT``, the HTTP method of a plain request, or ``TCP`` (a loopback relay)."""
    reason: str = ""
    """Why it was refused (the ``403`` body)."""


class EgressStats(Struct, kw_only=True, rename="camel"):
    """Egress of one sidecar since the host started (``system.stats``)."""

    connections: int = 0
    refused: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    open: int = 0
