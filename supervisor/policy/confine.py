"""Confinement profiles (PROTOCOL 7): the effective profile of a sidecar and the plan that
enforces it on this kernel.

# Strategy: two pure steps. :func:`effective` takes the entry's ``confine`` key by key over its
# family's ``[confine]`` over the strict defaults. :func:`resolve` turns that profile, the host's
# :class:`Layout` and the :class:`KernelFacts` into a :class:`ConfinePlan`: the final read and
# read-write path lists, how the network and the process limit are enforced, and what this
# kernel cannot enforce (``missing``, with fixes; with ``required``, the
# ``confinement-unavailable`` reason). Landlock only grants (a rule on a folder opens everything
# below it), so a grant that holds a never-granted path (``/etc`` holds ``/etc/shadow``, an app
# root holds ``.toolhost/``) is *carved*: replaced by grants on its entries minus the forbidden
# ones, recursively. The folder listing and symlink resolution are injected (``listdir``,
# ``realpath``) so every rule is table-testable without a disk.
"""

from __future__ import annotations

import fnmatch
import posixpath
from collections.abc import Callable, Iterable, Sequence
from typing import Any
from urllib.parse import urlsplit

import msgspec
from msgspec import UNSET

from supervisor.contracts.confine import ConfinePlan, KernelFacts, Layout, Profile
from supervisor.contracts.registry import ConfineConfig, ConfinementMode, NetworkGrant

STRICT = Profile()
"""Every sidecar without a family profile: ``project: read``, no network, 64 processes."""

SYSTEM_READ = (
    "/usr",
    "/bin",
    "/sbin",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/etc",
    "/proc",
    "/sys/devices/system/cpu",
    "/dev/urandom",
    "/dev/random",
)
"""Read and execute for every sidecar: programs, libraries, configuration less its secrets,
``/proc`` (Landlock's ptrace rule keeps other processes' ``environ``, ``mem`` and ``fd`` out of
reach: only the worker's own tree passes it), the CPU topology, the random devices."""
SYSTEM_WRITE = ("/dev/null", "/dev/zero", "/dev/full")
RESOLVER_READ = ("/run/systemd/resolve", "/run/resolvconf")
"""Where ``/etc/resolv.conf`` points on systemd and resolvconf systems (``network: host``)."""

ETC_SECRETS = (
    "/etc/shadow",
    "/etc/shadow-",
    "/etc/gshadow",
    "/etc/gshadow-",
    "/etc/sudoers",
    "/etc/sudoers.d",
    "/etc/ssh/ssh_host_*",
    "/etc/ssl/private",
    "/etc/security/opasswd",
    "/etc/krb5.keytab",
    "/etc/NetworkManager/system-connections",
    "/etc/wireguard",
    "/etc/ipsec.secrets",
    "/etc/ppp/chap-secrets",
    "/etc/ppp/pap-secrets",
)
"""Never granted under ``/etc`` (a trailing ``*`` matches names in that folder)."""
HOME_SECRETS = (
    ".ssh",
    ".gnupg",
    ".aws",
    ".azure",
    ".config/gcloud",
    ".config/gh",
    ".kube",
    ".docker",
    ".netrc",
    ".git-credentials",
    ".pypirc",
    ".npmrc",
    ".password-store",
    ".local/share/keyrings",
)
"""Never granted under ``$HOME``, even when a grant covers it (an app root that is ``$HOME``)."""

MAX_RULES = 2048
"""Grants after carving; a carve that would need more refuses the grant (reported)."""
PROXY_PORT = 3128
"""The egress proxy's port inside a worker's own network namespace."""

Listdir = Callable[[str], Sequence[str] | None]
Realpath = Callable[[str], str]

FIX = {
    "landlock": "run a kernel with Landlock (Linux 5.13+, CONFIG_SECURITY_LANDLOCK=y, landlock"
    " in the lsm= boot parameter)",
    "landlock-new": "run Linux 6.12 or later (Landlock ABI 6)",
    "seccomp": "run a kernel with seccomp filters (CONFIG_SECCOMP_FILTER=y) on x86_64 or aarch64",
    "netns": "run the host as root, or allow unprivileged user namespaces"
    " (sysctl kernel.unprivileged_userns_clone=1 / user.max_user_namespaces > 0)",
    "pids": "give the host a writable pids cgroup (systemd: Delegate=yes; a container:"
    " a cgroup namespace with the pids controller)",
}


def effective(entry: ConfineConfig, family: ConfineConfig | None = None) -> Profile:
    """The profile a sidecar runs with: each key from its entry, else its family, else
    :data:`STRICT` (a key replaces the default whole; lists are not merged)."""

    def pick(name: str, default: Any) -> Any:
        for source in (entry, family):
            if source is not None:
                value = getattr(source, name)
                if value is not UNSET:
                    return value
        return default

    return Profile(
        project=pick("project", STRICT.project),
        read=tuple(pick("read", ())),
        write=tuple(pick("write", ())),
        network=pick("network", STRICT.network),
        unix=tuple(pick("unix", ())),
        processes=pick("processes", STRICT.processes),
        keep=pick("keep", STRICT.keep),
        folders=tuple(pick("folders", ())),
    )


def _norm(path: str, base: str) -> str:
    return posixpath.normpath(path if posixpath.isabs(path) else posixpath.join(base, path))


def _under(path: str, root: str) -> bool:
    """``path`` is ``root`` or below it."""
    return path == root or path.startswith(root.rstrip("/") + "/")


def _matches(path: str, never: str) -> bool:
    """``path`` is the never-granted ``never`` (a trailing-``*`` pattern matches by name)."""
    if "*" in posixpath.basename(never):
        return posixpath.dirname(path) == posixpath.dirname(never) and fnmatch.fnmatchcase(
            posixpath.basename(path), posixpath.basename(never)
        )
    return path == never


def _blocked(path: str, never: Sequence[str]) -> str | None:
    """The never-granted path that ``path`` is or lies below."""
    for n in never:
        if _matches(path, n) or ("*" not in n and _under(path, n)):
            return n
        if "*" in n and _under(path, posixpath.dirname(n)) and path != posixpath.dirname(n):
            head = posixpath.dirname(n)
            first = path[len(head.rstrip("/")) + 1 :].split("/", 1)[0]
            if fnmatch.fnmatchcase(first, posixpath.basename(n)):
                return n
    return None


def never_hit(path: str, never: Sequence[str]) -> str | None:
    """The never-granted entry of ``never`` (a plan's ``never``) that ``path`` is or lies
    below (None: none)."""
    return _blocked(posixpath.normpath(path), never)


def _holds(path: str, never: Sequence[str]) -> bool:
    """Some never-granted path lies strictly below ``path``."""
    for n in never:
        anchor = posixpath.dirname(n) if "*" in posixpath.basename(n) else n
        if anchor != path and _under(anchor, path):
            return True
        if "*" in posixpath.basename(n) and anchor == path:
            return True
    return False


class _Carver:
    """Grants carved around never-granted paths (see the module's strategy)."""

    def __init__(
        self,
        never: Sequence[str],
        listdir: Listdir,
        realpath: Realpath,
        unlisted: Sequence[str] = (),
    ) -> None:
        self.never = never
        self.listdir = listdir
        self.realpath = realpath
        self.unlisted = unlisted
        self.refused: list[str] = []
        self.listed: list[str] = []
        """Carved folders granted listing (see :func:`grants`)."""
        self.count = 0

    def grant(self, path: str, why: str) -> list[str]:
        real = posixpath.normpath(self.realpath(path))
        hit = _blocked(path, self.never) or _blocked(real, self.never)
        if hit is not None:
            if why:
                self.refused.append(f"{path}: {why} names {hit}, which is never granted")
            return []
        if not _holds(real, self.never):
            self.count += 1
            return [real]
        if not _holds(real, self.unlisted):
            self.listed.append(real)
        return self._carve(real, why, 0)

    def _carve(self, folder: str, why: str, depth: int) -> list[str]:
        names = self.listdir(folder) if depth < 16 else None
        if names is None:
            return []
        out: list[str] = []
        for name in sorted(names):
            child = posixpath.join(folder, name)
            real = posixpath.normpath(self.realpath(child))
            if _blocked(child, self.never) or _blocked(real, self.never):
                continue
            if _holds(real, self.never):
                out += self._carve(real, why, depth + 1)
            else:
                self.count += 1
                out.append(real)
            if self.count > MAX_RULES:
                self.refused.append(
                    f"{folder}: needs more than {MAX_RULES} rules to leave out the never-granted"
                    " paths below it; grant its subfolders instead"
                )
                return []
        return out


def _dedupe(paths: Iterable[str]) -> tuple[str, ...]:
    """Unique paths, those below another one of the list left out."""
    ordered = sorted(set(paths))
    out: list[str] = []
    for p in ordered:
        if not any(_under(p, q) for q in out):
            out.append(p)
    return tuple(out)


def _never(layout: Layout) -> tuple[list[str], list[str]]:
    """(never read, never written) as absolute normalised paths."""
    secrets = [posixpath.normpath(p) for p in layout.secrets]
    secrets += list(ETC_SECRETS)
    if layout.home and layout.home != "/":
        secrets += [posixpath.join(layout.home, s) for s in HOME_SECRETS]
    unwritable = secrets + [posixpath.normpath(p) for p in layout.host_private]
    return secrets, unwritable


def grants(
    profile: Profile, layout: Layout, listdir: Listdir, realpath: Realpath
) -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...], tuple[str, ...], list[str]]:
    """(read, write, listed, never, refused): the final path lists of ``profile`` in ``layout``.

    ``listed``: folders carved around the host's own files (an app root that is the project
    holds ``.toolhost/``) are granted listing alone (``READ_DIR``) besides their entries'
    grants, so a worker can list the project's top and import a module from it (Python's
    finder lists a folder before it imports from it). Nothing can be made, removed or renamed
    at their top; the names in ``.toolhost/`` show (they are fixed; ``stat`` showed them
    already), their contents do not. A folder holding ``$HOME``'s or ``/etc``'s secrets is
    not listed."""
    root = layout.app_root
    never_read, never_write = _never(layout)
    # Listing a carved folder lists the never-granted folders below it too (Landlock grants
    # down the tree): only where those are the host's own (fixed names, contents still
    # refused), never $HOME's or /etc's secrets (key and credential names).
    unlisted = [n for n in never_read if n not in {posixpath.normpath(p) for p in layout.secrets}]
    reader = _Carver(never_read, listdir, realpath, unlisted)
    writer = _Carver(never_write, listdir, realpath, unlisted)
    read: list[str] = []
    write: list[str] = []
    for p in SYSTEM_READ:
        read += reader.grant(p, "")
    if profile.network == "host":
        for p in RESOLVER_READ:
            read += reader.grant(p, "")
    for p in layout.install:
        read += reader.grant(p, "")
    if layout.program:
        read += reader.grant(posixpath.dirname(posixpath.normpath(layout.program)), "")
    read += reader.grant(layout.cwd, "")
    if profile.project == "read":
        read += reader.grant(layout.project_dir, "confine.project")
    elif profile.project == "write":
        write += writer.grant(layout.project_dir, "confine.project")
    for p in profile.read:
        read += reader.grant(_norm(p, root), f"confine.read {p!r}")
    for p in profile.write:
        full = _norm(p, root)
        if _blocked(full, never_write) and not _blocked(full, never_read):
            writer.refused.append(f"{full}: confine.write {p!r} is host-private; granted read")
            read += reader.grant(full, "")
        else:
            write += writer.grant(full, f"confine.write {p!r}")
    for p in SYSTEM_WRITE:
        write += writer.grant(p, "")
    write_final = _dedupe(write)
    read_final = tuple(p for p in _dedupe(read) if not any(_under(p, w) for w in write_final))
    granted = (*read_final, *write_final)
    listed = tuple(
        p for p in _dedupe(reader.listed + writer.listed) if not any(_under(p, g) for g in granted)
    )
    refused = reader.refused + writer.refused
    return read_final, write_final, listed, tuple(sorted(set(never_read))), refused


def folders_to_make(
    profile: Profile, layout: Layout, realpath: Realpath
) -> tuple[list[str], list[str]]:
    """(folders, refused): the project folders of ``profile.folders`` the host makes at load
    (absolute), and the ones it will not make, each with why.

    Only with ``project: write`` on a project the resolver carves (it holds a never-written
    path: ``projectDir: "."``): elsewhere the sidecar makes them itself when it needs them.
    Each is a name at the project's top (below it the sidecar can make folders itself), not a
    never-granted or host-private path, and not a symlink leaving the project (the host
    creates it with its own rights; nothing at a carved top can be replaced by a sidecar)."""
    if profile.project != "write" or not profile.folders:
        return [], []
    _, never_write = _never(layout)
    project = posixpath.normpath(realpath(layout.project_dir))
    if not _holds(project, never_write):
        return [], []
    out: list[str] = []
    refused: list[str] = []
    for rel in profile.folders:
        full = posixpath.normpath(posixpath.join(project, rel))
        real = posixpath.normpath(realpath(full))
        if "/" in rel or rel in (".", "..") or not _under(real, project):
            refused.append(f"confine.folders {rel!r}: not a folder name at projectDir's top")
        elif real == project or _blocked(full, never_write) or _blocked(real, never_write):
            refused.append(f"confine.folders {rel!r}: the project itself or host-private")
        else:
            out.append(real)
    return out, refused


def _network(
    profile: Profile, kernel: KernelFacts, missing: list[tuple[str, str]]
) -> tuple[str, tuple[str, ...], tuple[int, ...], str, tuple[int, ...] | None, str]:
    """(network, allow, loopback, netns, tcp_connect, socket_filter) for ``profile``."""
    net = profile.network
    if net == "host":
        return "host", (), (), "", None, "any"
    grant = net if isinstance(net, NetworkGrant) else NetworkGrant()
    allow, loopback = tuple(grant.allow), tuple(sorted(set(grant.loopback)))
    network = "proxy" if allow else "none"
    filtered = bool(kernel.seccomp and kernel.arch)
    if kernel.netns:
        # Nothing to reach: no inet socket at all either (a clear EPERM, a second wall).
        closed = filtered and not allow and not loopback
        return network, allow, loopback, kernel.netns, None, "none" if closed else "any"
    if not allow and not loopback:
        if filtered:
            return network, allow, loopback, "", None, "none"
        if kernel.landlock_abi >= 4:
            missing.append(("network: UDP and raw sockets (no namespace, no filter)", "netns"))
            return network, allow, loopback, "", (), "any"
        missing.append(("network isolation", "netns"))
        return network, allow, loopback, "", None, "any"
    # Something must get out (the proxy, loopback ports) and no namespace can hold it.
    if kernel.landlock_abi >= 4:
        missing.append(
            (
                "network namespace: the granted TCP ports are reachable on every address,"
                " and the proxy identifies the worker by a token",
                "netns",
            )
        )
        # The proxy's own port is added per worker (only the spawn path knows it).
        return network, allow, loopback, "", loopback, "stream" if filtered else "any"
    missing.append(("network isolation", "netns"))
    return network, allow, loopback, "", None, "any"


def resolve(
    sidecar: str,
    profile: Profile,
    *,
    mode: ConfinementMode,
    kernel: KernelFacts,
    layout: Layout,
    listdir: Listdir,
    realpath: Realpath,
) -> ConfinePlan:
    """The plan that confines ``sidecar``'s workers to ``profile`` on this kernel.

    Args:
        sidecar: The sidecar id (named in reasons).
        profile: Its effective profile (:func:`effective`).
        mode: ``host.confinement``.
        kernel: What this kernel can enforce (``processes.confine.probe``).
        layout: Where things are (absolute paths).
        listdir: Names in a folder, or None when it cannot be listed (``os.listdir``).
        realpath: Symlink resolution (``os.path.realpath``).

    Returns:
        The plan; with ``mode: off`` an empty one; with ``required`` and anything missing,
        ``unavailable`` holds the reason and the sidecar must not start.
    """
    if mode == "off":
        return ConfinePlan(
            sidecar=sidecar, mode=mode, network="host", processes=0, keep=profile.keep
        )
    read, write, listed, never, refused = grants(profile, layout, listdir, realpath)
    gaps: list[tuple[str, str]] = []
    abi = kernel.landlock_abi
    if abi < 1:
        gaps.append(("filesystem (Landlock)", "landlock"))
    else:
        if abi < 3:
            gaps.append(("file truncation (Landlock ABI 3, Linux 6.2)", "landlock-new"))
        if abi < 5:
            gaps.append(("device ioctls (Landlock ABI 5, Linux 6.10)", "landlock-new"))
        if abi < 6:
            gaps.append(
                ("signal and abstract-socket scoping (Landlock ABI 6, Linux 6.12)", "landlock-new")
            )
    network, allow, loopback, netns, tcp, sockets = _network(profile, kernel, gaps)
    if tcp is not None and abi < 4:
        tcp = None
    filtered = bool(kernel.seccomp and kernel.arch)
    if not filtered:
        gaps.append(("syscall filter (seccomp)", "seccomp"))
    if kernel.pids_cgroup:
        pids = "cgroup"
    elif kernel.root:
        pids = "none"
        gaps.append(("process limit (root is exempt from RLIMIT_NPROC)", "pids"))
    else:
        pids = "rlimit"
    missing = tuple(what for what, _ in gaps)
    fixes = tuple(dict.fromkeys(FIX[key] for _, key in gaps))
    unavailable = ""
    if mode == "required" and missing:
        unavailable = (
            f"confinement-unavailable: this kernel cannot enforce {', '.join(missing)} of"
            f" sidecar {sidecar}'s profile; fix: {'; '.join(fixes)}; or set host.confinement"
            ' to "best-effort"'
        )
    return ConfinePlan(
        sidecar=sidecar,
        mode=mode,
        read=read,
        write=write,
        listed=listed,
        never=never,
        refused=tuple(refused),
        network=network,  # type: ignore[arg-type]
        allow=allow,
        loopback=loopback,
        unix=tuple(_norm(p, layout.app_root) for p in profile.unix),
        processes=profile.processes,
        keep=profile.keep,
        landlock_abi=abi,
        netns=netns,  # type: ignore[arg-type]
        tcp_connect=tcp,
        socket_filter=sockets if filtered else "any",  # type: ignore[arg-type]
        allow_unix=bool(profile.unix),
        seccomp_arch=kernel.arch if filtered else "",
        drop_caps=kernel.root,
        pids=pids,  # type: ignore[arg-type]
        proxy_port=_proxy_port(loopback) if allow and netns else 0,
        missing=missing,
        fixes=fixes,
        unavailable=unavailable,
    )


def _proxy_port(loopback: Sequence[int]) -> int:
    port = PROXY_PORT
    while port in loopback:
        port += 1
    return port


def with_collector(profile: Profile, endpoint: str) -> Profile:
    """``profile`` able to reach the OTLP collector at ``endpoint`` (``host.telemetry`` on: a
    sidecar's SDK exports its own spans there, docs/telemetry.md). A collector on this machine
    (``localhost``, a loopback address) becomes a ``loopback`` port, another one an ``allow``
    rule (reached through the egress proxy); ``network: host`` and an unparsable endpoint are
    left as they are."""
    parts = urlsplit(endpoint)
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        return profile
    host = (parts.hostname or "").lower()
    if not host or profile.network == "host":
        return profile
    grant = profile.network if isinstance(profile.network, NetworkGrant) else NetworkGrant()
    loopback, allow = list(grant.loopback), list(grant.allow)
    if host == "localhost" or host.startswith("127.") or host == "::1":
        if port not in loopback:
            loopback.append(port)
    else:
        rule = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        if rule not in allow and "*" not in allow:
            allow.append(rule)
    return msgspec.structs.replace(profile, network=NetworkGrant(allow=allow, loopback=loopback))
