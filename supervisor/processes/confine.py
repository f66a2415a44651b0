"""Confinement at the process layer: what this kernel can do, the walls of one worker, the exec
shim's command line, and the facts read back from a running worker (PROTOCOL 7).

# Strategy: the policy (``policy.confine``) decides *what* a sidecar may touch, once per registry
# load; this module turns a plan into one worker's :class:`~supervisor.processes.walls.Walls`
# (its private ``TMPDIR``, its pids group, the egress proxy's port, the report channel) and says
# how a spawn path puts them up: a zygote child (single-threaded) calls
# ``walls.arm(w).apply()`` itself before it runs the sidecar; the exec path runs
# :func:`shim_argv`, a bare interpreter that applies them and execs the program (``preexec_fn``
# in the threaded host is not safe). :func:`facts` is what the snapshot shows: ``NoNewPrivs``,
# ``Seccomp`` and the network namespace read from ``/proc/<pid>``, Landlock from the child's
# report (the kernel shows no Landlock state in ``/proc``).
"""

from __future__ import annotations

import contextlib
import functools
import importlib.machinery
import importlib.util
import os
import shutil
import socket as stdsocket
import sys
import tempfile
from collections.abc import Mapping, Sequence

from supervisor.contracts.confine import ConfinementFacts, ConfinePlan, KernelFacts
from supervisor.policy.confine_explain import network_fact
from supervisor.processes import landlock, netns, seccomp
from supervisor.processes.pids_cgroup import PidsCgroups
from supervisor.processes.walls import Walls

CAP_SYS_ADMIN = 21
SHIM = os.path.join(os.path.dirname(os.path.abspath(__file__)), "confine_exec.py")
SHIM_FAILED = 126
"""The shim's exit status when a wall could not go up under ``required`` (or exec failed)."""


def _cap_eff() -> int:
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("CapEff:"):
                    return int(line.split()[1], 16)
    except (OSError, ValueError):
        pass
    return 0


@functools.cache
def probe() -> KernelFacts:
    """What this kernel, for this host process, can enforce (probed once per process; the
    user-namespace probe starts one short interpreter)."""
    if not sys.platform.startswith("linux"):
        return KernelFacts()
    root = os.geteuid() == 0
    if root and _cap_eff() & (1 << CAP_SYS_ADMIN):
        way = "root"
    else:
        way = "user" if netns.probe_user() else ""
    return KernelFacts(
        landlock_abi=landlock.abi_version(),
        seccomp=seccomp.available(),
        arch=seccomp.arch(),
        root=root,
        netns=way,  # type: ignore[arg-type]
        pids_cgroup=PidsCgroups.probe() is not None,
    )


def install_paths() -> tuple[str, ...]:
    """The interpreter and what it loads (read and execute for every worker): the prefixes
    (standard library, virtual environment), the interpreter's own folder, the ``supervisor``
    and ``sidecars`` packages."""
    paths = [sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix]
    paths.append(os.path.dirname(os.path.realpath(sys.executable)))
    paths.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    # Every finder, not only sys.path's: an editable install finds ``sidecars`` through its own
    # meta path finder, and a host started outside the repository has no path entry for it.
    try:
        spec = importlib.util.find_spec("sidecars")
    except (ImportError, ValueError):
        spec = None
    if spec is not None and spec.submodule_search_locations:
        paths += list(spec.submodule_search_locations)
    return tuple(dict.fromkeys(os.path.normpath(p) for p in paths if p))


def program_of(argv: Sequence[str], cwd: str) -> str:
    """The file (or package folder) a command runs, for its folder's read grant: the script or
    ``-m`` module of a Python command (found without importing it), else the command."""
    if not argv:
        return ""
    args = list(argv[1:])
    name = os.path.basename(argv[0])
    if name.startswith("python"):
        args = _past_interpreter_flags(args)
    if name.startswith("python") and args:
        if args[0] == "-m" and len(args) > 1:
            top = args[1].split(".", 1)[0]
            spec = importlib.machinery.PathFinder.find_spec(top, [cwd, *sys.path])
            if spec is not None:
                if spec.submodule_search_locations:
                    folder = next(iter(spec.submodule_search_locations))
                    return os.path.join(folder, "__init__.py")
                return spec.origin or ""
            return ""
        if not args[0].startswith("-"):
            return os.path.normpath(os.path.join(cwd, args[0]))
    return os.path.normpath(os.path.join(cwd, argv[0]))


_FLAG_ARGUMENT = ("W", "X")
"""Interpreter options whose value may be the next argument (``-W error``, ``-X dev``)."""


def _past_interpreter_flags(args: list[str]) -> list[str]:
    """``args`` of a Python command from its ``-m`` or script on (``-B``, ``-u``, ``-X dev``,
    ``-W error`` skipped); a ``-c`` command runs no file (nothing left)."""
    i = 0
    while i < len(args):
        a = args[i]
        if a == "-m" or not a.startswith("-") or a == "-":
            return args[i:]
        if a == "--":
            return args[i + 1 :]
        if a.startswith("--"):  # --check-hash-based-pycs MODE (others take none)
            i += 2 if a == "--check-hash-based-pycs" else 1
            continue
        letters = a[1:]
        for j, letter in enumerate(letters):
            if letter == "c":
                return []
            if letter == "m":  # -um mod: the module follows
                return ["-m", *(args[i + 1 :] if j == len(letters) - 1 else [letters[j + 1 :]])]
            if letter in _FLAG_ARGUMENT:
                if j == len(letters) - 1:
                    i += 1  # its value is the next argument
                break
        i += 1
    return []


def private_tmpdir(sidecar: str, root: str | None = None) -> str:
    """A new 0700 folder for a sidecar's workers' ``TMPDIR`` s (remove it with
    :func:`remove_tmpdir`), in ``root`` (the host's temp folder: ``processes.host_temp``) or
    else the system's. Its path stays short: a worker's sockets live below it (108 bytes)."""
    safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in sidecar)[:40]
    return tempfile.mkdtemp(prefix=f"{safe}-" if root else f"toolhost-{safe}-", dir=root)


def remove_tmpdir(path: str) -> None:
    """Remove a worker's ``TMPDIR`` and what it left there (never follows a symlink out)."""
    with contextlib.suppress(OSError):
        shutil.rmtree(path)


def walls_for(
    plan: ConfinePlan,
    *,
    tmpdir: str | None = None,
    cgroup: str | None = None,
    nproc: int = 0,
    proxy_port: int = 0,
    channel: int = -1,
    ruleset_fd: int = -1,
    netns_fds: Sequence[int] = (),
    gate: bool = False,
    cgroup_by_host: bool = False,
) -> Walls:
    """One worker's walls from its sidecar's plan (:class:`SidecarWalls.worker` fills the
    per-sidecar parts).

    Args:
        plan: The sidecar's plan (``policy.confine.resolve``); must be active.
        tmpdir: The worker's private ``TMPDIR`` (granted read-write when the child builds the
            ruleset; a prebuilt ruleset grants the sidecar's temp root instead).
        cgroup: Its pids group folder (``PidsCgroups.create``), when ``plan.pids`` is cgroup.
        nproc: ``RLIMIT_NPROC`` when ``plan.pids`` is rlimit (the user's tasks now plus
            ``plan.processes``: ``processes.limits.user_tasks``).
        proxy_port: The host's egress proxy port on loopback, for a plan without a network
            namespace that reaches the proxy by TCP (Landlock's port rule; identity by token).
        channel: The child's end of the report channel (``socket.socketpair``; -1: none).
        ruleset_fd: A Landlock ruleset built once for the sidecar (-1: built in the child).
        netns_fds: The sidecar's held namespaces (``netns.Holder.fds``).
        gate: The filter sends every ``connect`` to the host's Unix socket gate.
        cgroup_by_host: The host moves the child into ``cgroup`` (the exec shim: it waits for
            the host's word on ``channel``; ``Prepared.host_join``) instead of the child.
    """
    write = list(plan.write)
    devices = [p for p in write if p.startswith("/dev/")]
    write = [p for p in write if not p.startswith("/dev/")]
    if tmpdir:
        write.append(tmpdir)
    tcp = plan.tcp_connect
    if tcp is not None and plan.network == "proxy" and proxy_port:
        tcp = (*tcp, proxy_port)
    return Walls(
        strict=plan.mode == "required",
        read=plan.read,
        write=write,
        devices=devices,
        listed=plan.listed,
        landlock_abi=plan.landlock_abi,
        tcp_connect=tcp,
        ruleset_fd=ruleset_fd,
        netns_fds=list(netns_fds),
        seccomp_arch=plan.seccomp_arch,
        sockets=plan.socket_filter,
        allow_unix=plan.allow_unix,
        gate=gate and plan.allow_unix and bool(plan.seccomp_arch),
        drop_caps=plan.drop_caps,
        cgroup_procs=PidsCgroups.procs_file(cgroup) if cgroup and plan.pids == "cgroup" else "",
        cgroup_by_host=cgroup_by_host and bool(cgroup) and plan.pids == "cgroup" and channel >= 0,
        nproc=nproc if plan.pids == "rlimit" else 0,
        channel=channel,
    )


class SidecarWalls:
    """What one sidecar's workers share, made once per plan and held by the host: the Landlock
    ruleset (built here: a worker only enters it), the network namespace with the listeners
    the egress proxy serves, and the folder the workers' private ``TMPDIR`` s live in.

    Args:
        plan: The sidecar's plan (active).
        tmp_root: Where the sidecar's temp folder is made (default the system's).
        proxy_port: Without a namespace, the host's shared proxy port (Landlock TCP rule).

    Raises:
        OSError: A wall the plan needs could not be prepared (under ``required`` the sidecar
            must not start; else the plan's ``missing`` grows by the message).
    """

    def __init__(self, plan: ConfinePlan, *, tmp_root: str | None = None, proxy_port: int = 0):
        self.plan = plan
        self.tmp_root = private_tmpdir(plan.sidecar, tmp_root)
        self.problems: list[str] = []
        self.ruleset_fd = -1
        self.rules = 0
        self.holder: netns.Holder | None = None
        self._proxy_port = proxy_port
        try:
            if plan.landlock_abi > 0:
                w = walls_for(plan, tmpdir=self.tmp_root, proxy_port=proxy_port)
                ruleset = landlock.Ruleset(
                    plan.landlock_abi,
                    read=w.read,
                    write=w.write,
                    devices=w.devices,
                    listed=w.listed,
                    tcp_connect=w.tcp_connect,
                )
                self.ruleset_fd = ruleset.build()
                self.rules = ruleset.rules
            if plan.netns:
                ports = ([plan.proxy_port] if plan.proxy_port else []) + list(plan.loopback)
                self.holder = netns.Holder.create(plan.netns, ports)
        except OSError:
            self.close()
            raise

    @property
    def listeners(self) -> dict[int, stdsocket.socket]:
        """``port -> listener`` in the sidecar's namespace: the proxy's (``plan.proxy_port``)
        and one per loopback grant (hand them to ``EgressProxy.serve_listener``)."""
        return self.holder.listeners if self.holder is not None else {}

    def worker(
        self,
        *,
        cgroup: str | None = None,
        nproc: int = 0,
        channel: int = -1,
        gate: bool = False,
        cgroup_by_host: bool = False,
    ) -> tuple[Walls, str]:
        """One worker's walls and its private ``TMPDIR`` (0700, below the sidecar's temp
        folder; remove it with :func:`remove_tmpdir` when the worker ends); ``cgroup_by_host``:
        the host moves the child into ``cgroup`` (:func:`walls_for`)."""
        tmpdir = tempfile.mkdtemp(prefix="w-", dir=self.tmp_root)
        walls = walls_for(
            self.plan,
            tmpdir=tmpdir,
            cgroup=cgroup,
            nproc=nproc,
            proxy_port=self._proxy_port,
            channel=channel,
            ruleset_fd=self.ruleset_fd,
            netns_fds=self.holder.fds if self.holder is not None else (),
            gate=gate,
            cgroup_by_host=cgroup_by_host,
        )
        return walls, tmpdir

    def inherited(self, walls: Walls) -> list[int]:
        """The descriptors a child must inherit for ``walls`` (``pass_fds`` of the shim)."""
        fds = [walls.ruleset_fd] if walls.ruleset_fd >= 0 else []
        fds += walls.netns_fds
        if walls.channel >= 0:
            fds.append(walls.channel)
        return fds

    def close(self) -> None:
        """Release the ruleset, the namespace and the temp folder (after the last worker)."""
        if self.ruleset_fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self.ruleset_fd)
            self.ruleset_fd = -1
        if self.holder is not None:
            self.holder.close()
            self.holder = None
        remove_tmpdir(self.tmp_root)


def shim_argv(argv: Sequence[str], walls_fd: int) -> list[str]:
    """The exec path's command: a bare interpreter that reads the walls from ``walls_fd``
    (``Walls.dumps``, inherited), puts them up and execs ``argv`` (resolved program first).
    Pass ``walls_fd`` and :meth:`SidecarWalls.inherited` to the child (``pass_fds``)."""
    return [sys.executable, "-I", "-S", SHIM, str(walls_fd), "--", *argv]


def read_status(pid: int) -> dict[str, str]:
    """``/proc/<pid>/status`` as name -> value (empty when the process is gone)."""
    try:
        with open(f"/proc/{pid}/status", encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return {}
    out: dict[str, str] = {}
    for line in lines:
        name, sep, value = line.partition(":")
        if sep:
            out[name] = value.strip()
    return out


def own_netns(pid: int) -> bool | None:
    """Whether ``pid`` has a network namespace other than this process's (None: unknown)."""
    try:
        return os.stat(f"/proc/{pid}/ns/net").st_ino != os.stat("/proc/self/ns/net").st_ino
    except OSError:
        return None


def facts(plan: ConfinePlan, pid: int, report: Mapping[str, object] | None) -> ConfinementFacts:
    """``stability.details.confinement`` of a running worker: read from ``/proc/<pid>`` and
    the child's report, never from the configuration.

    Args:
        plan: The worker's plan (its mode, and what it would reach through the host).
        pid: The worker's pid.
        report: What the child's ``Armed.apply`` reported (None: no report came).
    """
    status = read_status(pid)
    report = report or {}
    nnp = status.get("NoNewPrivs") == "1"
    filtered = status.get("Seccomp") == "2"
    missing = list(plan.missing)
    errors = report.get("errors") or []
    if isinstance(errors, list):
        missing += [str(e) for e in errors]
    if plan.unix and report and not report.get("gate"):
        missing.append("confine.unix by path (every pathname Unix socket is reachable)")
    landlock_on = bool(report.get("landlock"))
    if not landlock_on:
        fs = "none"
    elif plan.landlock_abi < 3:  # truncation of readable files is not handled
        fs = "partial"
    else:
        fs = "enforced"
    isolated = own_netns(pid)
    if isolated is None:  # exited (not reaped yet): its namespace is gone; the report says
        isolated = bool(report.get("netns"))
    network = network_fact(plan, bool(isolated or report.get("tcp")))
    return ConfinementFacts(
        mode=plan.mode,
        filesystem=fs,  # type: ignore[arg-type]
        network=network,  # type: ignore[arg-type]
        syscalls="filtered" if filtered else "none",
        no_new_privs=nnp,
        missing=missing,
    )
