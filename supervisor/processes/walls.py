"""The walls of one worker, put up in the child between fork and exec: :func:`arm` in the
parent, :meth:`Armed.apply` in the child.

# Strategy: the standard library only (with :mod:`landlock`, :mod:`seccomp`, :mod:`netns` and
# :mod:`linux`, whose ``prctl`` it shares), so the exec shim (``confine_exec``) runs it in a
# bare ``python -I -S``, and the zygote's child (``zygote_main``) before the worker's first
# instruction. :class:`Walls` is plain data (``marshal``, for the shim and the zygote).
# :func:`arm` does everything that allocates or may take a lock: the BPF program, the Landlock
# buffers, the encoded paths, the bound libc functions, ``cap_last_cap`` (in the parent, or in a
# single-threaded child). :meth:`Armed.apply` then runs, in this order, only syscalls: join the
# pids cgroup (while writing ``/sys`` is still allowed; in the exec shim the host joins it from
# outside while the shim's interpreter starts, and the child waits for the host's word on its
# channel and checks ``/proc/self/cgroup``), set ``RLIMIT_NPROC`` where no cgroup
# exists, enter the network namespace (and close its descriptors), build the Landlock ruleset
# (while every path can still be opened), drop every capability (bounding set, ambient,
# effective, permitted, inheritable; ``SECBIT_NOROOT`` locked), set ``no_new_privs``, enter the
# Landlock domain, install the syscall filter, and send the report to the host over the
# channel. With ``strict`` (``host.confinement: required``) a failed step raises, so nothing
# runs with less than was promised; else it is reported and the rest still goes up.
"""

from __future__ import annotations

import errno
import marshal
import os
import resource
import sys

if __package__:  # inside the package
    from supervisor.processes import cabi, landlock, linux, seccomp
else:  # pragma: no cover - loaded by the exec shim from this folder (never the package's copy)
    import cabi  # type: ignore[no-redef]
    import landlock  # type: ignore[no-redef]
    import linux  # type: ignore[no-redef]
    import seccomp  # type: ignore[no-redef]

PR_CAPBSET_DROP = 24
PR_SET_SECUREBITS = 28
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_CLEAR_ALL = 4
PR_SET_NO_NEW_PRIVS = 38
SECURE_NOROOT = 0x01 | 0x02 | 0x40 | 0x80
"""SECBIT_NOROOT, SECBIT_NO_CAP_AMBIENT_RAISE, each locked: uid 0 gains nothing at exec."""
CAP_VERSION_3 = 0x20080522


class Walls:
    """What to put up in one worker (plain data; built by ``processes.confine.walls_for``).

    Args:
        strict: A step that fails aborts (``host.confinement: required``).
        read: Landlock grants: read and execute.
        write: Landlock grants: read, execute and write (never device nodes).
        devices: Landlock grants on device files: read, write and ioctl.
        listed: Landlock grants on folders: listing alone.
        landlock_abi: The ABI to build for (0: no Landlock).
        tcp_connect: Landlock TCP: the only ports ``connect`` may reach (None: not handled).
        scoped: Landlock ABI 6 signal and abstract-socket scoping.
        audit: Landlock ABI 7: log denials after exec to the audit log.
        ruleset_fd: A Landlock ruleset the parent built (``landlock.Ruleset.build``), inherited:
            the child only enters it (-1: the child builds it from ``read``/``write``).
        netns_fds: Namespaces to join (``netns.Holder.fds``: the user namespace first, if any,
            then the network namespace; empty: stay in the host's).
        seccomp_arch: The syscall filter's architecture (``""``: no filter).
        sockets: Socket families the filter lets through besides ``AF_UNIX``.
        allow_unix: The filter lets ``socket(AF_UNIX)`` through.
        gate: The filter sends every ``connect`` to the host (the ``unix`` grants are checked
            there: ``host/unix_gate.py``); its notification descriptor goes with the report.
        drop_caps: Drop every capability (the host runs as root).
        cgroup_procs: The pids group's ``cgroup.procs`` to join (``""``: none).
        cgroup_joined: The process is in that group already (the zygote's spare joined it and
            forked the worker there): the join is skipped, the report still says ``cgroup``.
        cgroup_by_host: The host moves the process into that group (the exec shim: the host
            writes the child's pid while the shim's interpreter starts, off its critical
            path): the child waits for the host's word on ``channel``, then checks
            ``/proc/self/cgroup`` itself rather than trusting it.
        nproc: ``RLIMIT_NPROC`` to set (0: leave it).
        channel: An inherited ``AF_UNIX`` socket for the report (-1: none).
    """

    __slots__ = (
        "allow_unix",
        "audit",
        "cgroup_by_host",
        "cgroup_joined",
        "cgroup_procs",
        "channel",
        "devices",
        "drop_caps",
        "gate",
        "landlock_abi",
        "listed",
        "netns_fds",
        "nproc",
        "read",
        "ruleset_fd",
        "scoped",
        "seccomp_arch",
        "sockets",
        "strict",
        "tcp_connect",
        "write",
    )

    def __init__(
        self,
        *,
        strict: bool = False,
        read: list[str] | tuple[str, ...] = (),
        write: list[str] | tuple[str, ...] = (),
        devices: list[str] | tuple[str, ...] = (),
        listed: list[str] | tuple[str, ...] = (),
        landlock_abi: int = 0,
        tcp_connect: list[int] | tuple[int, ...] | None = None,
        scoped: bool = True,
        audit: bool = True,
        ruleset_fd: int = -1,
        netns_fds: list[int] | tuple[int, ...] = (),
        seccomp_arch: str = "",
        sockets: str = "any",
        allow_unix: bool = True,
        gate: bool = False,
        drop_caps: bool = False,
        cgroup_procs: str = "",
        cgroup_joined: bool = False,
        cgroup_by_host: bool = False,
        nproc: int = 0,
        channel: int = -1,
    ) -> None:
        self.strict = strict
        self.read = list(read)
        self.write = list(write)
        self.devices = list(devices)
        self.listed = list(listed)
        self.landlock_abi = landlock_abi
        self.tcp_connect = None if tcp_connect is None else list(tcp_connect)
        self.scoped = scoped
        self.audit = audit
        self.ruleset_fd = ruleset_fd
        self.netns_fds = list(netns_fds)
        self.seccomp_arch = seccomp_arch
        self.sockets = sockets
        self.allow_unix = allow_unix
        self.gate = gate
        self.drop_caps = drop_caps
        self.cgroup_procs = cgroup_procs
        self.cgroup_joined = cgroup_joined
        self.cgroup_by_host = cgroup_by_host
        self.nproc = nproc
        self.channel = channel

    def as_dict(self) -> dict[str, object]:
        return {name: getattr(self, name) for name in self.__slots__}

    def dumps(self) -> bytes:
        """For the exec shim (``marshal``: same interpreter both sides, and it needs no import
        in the shim, which starts in a bare ``python -I -S``)."""
        return marshal.dumps(self.as_dict())

    @classmethod
    def loads(cls, data: bytes) -> Walls:
        return cls(**marshal.loads(data))


class ConfinementError(OSError):
    """A wall could not be put up while ``strict``; the worker must not run."""


class _CapHeader(cabi.Structure):
    _fields_ = [("version", cabi.c_uint32), ("pid", cabi.c_int)]


class _CapData(cabi.Structure):
    _fields_ = [
        ("effective", cabi.c_uint32),
        ("permitted", cabi.c_uint32),
        ("inheritable", cabi.c_uint32),
    ]


def _last_cap() -> int:
    try:
        with open("/proc/sys/kernel/cap_last_cap", "rb") as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return 40


class Armed:
    """Walls prepared in the parent; :meth:`apply` puts them up in the child."""

    def __init__(self, walls: Walls) -> None:
        w = walls
        self.walls = w
        self.ruleset = (
            landlock.Ruleset.entering(w.landlock_abi, w.ruleset_fd, audit=w.audit)
            if w.ruleset_fd >= 0
            else landlock.Ruleset(
                w.landlock_abi,
                read=w.read,
                write=w.write,
                devices=w.devices,
                listed=w.listed,
                tcp_connect=w.tcp_connect,
                scoped=w.scoped,
                audit=w.audit,
            )
            if w.landlock_abi > 0
            else None
        )
        arch = w.seccomp_arch
        self.filter = (
            seccomp.Filter(
                seccomp.program(arch, allow_unix=w.allow_unix, sockets=w.sockets, gate=w.gate),
                arch,
            )
            if arch
            else None
        )
        self.listener = -1
        self.join = _netns().Join(w.netns_fds) if w.netns_fds else None
        self.cgroup = os.fsencode(w.cgroup_procs) if w.cgroup_procs else b""
        self._prctl = linux.PRCTL or _no_prctl
        self._capset = cabi.CDLL(None).capset
        self._cap_header = _CapHeader(CAP_VERSION_3, 0)
        self._cap_data = (_CapData * 2)()
        self._last_cap = _last_cap()
        self.errors: list[str] = []
        self.report: dict[str, object] = {
            "landlock": 0,
            "rules": 0,
            "skipped": [],
            "tcp": False,
            "scoped": False,
            "netns": False,
            "caps": False,
            "nnp": False,
            "seccomp": False,
            "gate": False,
            "pids": "none",
            "joined_ahead": False,
            "joined_by_host": False,
            "errors": self.errors,
        }

    def _fail(self, step: str, exc: OSError) -> None:
        message = f"{step}: {exc.strerror or exc}"
        if self.walls.strict:
            raise ConfinementError(exc.errno or 1, message)
        self.errors.append(message)

    def apply(self) -> dict[str, object]:
        """Put every wall up, in order, in the calling (child) process, and send the report;
        returns it.

        Raises:
            ConfinementError: With ``strict``, the first step that failed (the report, sent
                before, names it).
        """
        try:
            self._apply()
        except ConfinementError as exc:
            self.errors.append(str(exc.strerror))
            self._send()
            raise
        self._send()
        return self.report

    def _apply(self) -> None:
        w = self.walls
        r = self.report
        if self.cgroup and w.cgroup_joined:
            r["pids"] = "cgroup"  # a fork keeps its parent's group: no migration to wait for
            r["joined_ahead"] = True
        elif self.cgroup and w.cgroup_by_host:
            try:
                self._host_joined()
                r["pids"] = "cgroup"
                r["joined_by_host"] = True
            except OSError as exc:
                self._fail("pids cgroup", exc)
        elif self.cgroup:
            try:
                fd = os.open(self.cgroup, os.O_WRONLY | os.O_CLOEXEC)
                try:
                    os.write(fd, b"%d" % os.getpid())
                finally:
                    os.close(fd)
                r["pids"] = "cgroup"
            except OSError as exc:
                self._fail("pids cgroup", exc)
        if w.nproc > 0:
            try:
                resource.setrlimit(resource.RLIMIT_NPROC, (w.nproc, w.nproc))
                if r["pids"] == "none":
                    r["pids"] = "rlimit"
            except (OSError, ValueError) as exc:
                self._fail("RLIMIT_NPROC", OSError(1, str(exc)))
        if self.join is not None:
            try:
                self.join.enter()
                r["netns"] = True
            except OSError as exc:
                self._fail("network namespace", exc)
            finally:  # the worker must not hold them (nor a program it execs)
                for fd in self.join.fds:
                    try:
                        os.close(fd)
                    except OSError:
                        pass
        ruleset = self.ruleset
        if ruleset is not None and ruleset.fd < 0:
            try:
                ruleset.build()
            except OSError as exc:
                self._fail("landlock", exc)
                ruleset = None
        if w.drop_caps:
            self._drop_caps()
        if self._prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0:
            r["nnp"] = True
        else:
            self._fail("no_new_privs", OSError(cabi.get_errno(), "prctl refused"))
        if ruleset is not None:
            try:
                ruleset.restrict()
                r["landlock"] = ruleset.abi
                r["rules"] = ruleset.rules
                r["skipped"] = ruleset.skipped
                r["tcp"] = bool(ruleset.handled_net)
                r["scoped"] = bool(ruleset.scoped)
            except OSError as exc:
                self._fail("landlock", exc)
        if self.filter is not None:
            try:
                self.listener = self.filter.install(listener=w.gate)
                r["seccomp"] = True
                r["gate"] = self.listener >= 0
            except OSError as exc:
                self._fail("seccomp", exc)

    def _host_joined(self) -> None:
        """Wait for the host's word that it moved this process into its group (``ok``, or
        ``no ERRNO WHY``), then check ``/proc/self/cgroup`` says so: nothing of the worker runs,
        and it cannot fork, before it is in its group.

        Raises:
            OSError: The host could not move it, no word can come, or it is not in its group.
        """
        channel = self.walls.channel
        if channel < 0:
            raise OSError(errno.EBADF, "no channel for the host's word")
        word = os.read(channel, 512)  # blocks until the host's join is done
        if not word:
            raise OSError(errno.EIO, "no word from the host on its join")
        if word != b"ok":
            code, _, why = word[3:].decode(errors="replace").partition(" ")
            raise OSError(
                int(code) if word.startswith(b"no ") and code.isdigit() else errno.EIO,
                f"the host could not move this worker into its group ({why or repr(word)})",
            )
        folder = os.path.dirname(self.cgroup)
        tail = b"/".join(folder.rsplit(b"/", 2)[-2:])  # <host's folder>/<worker's group>
        with open("/proc/self/cgroup", "rb") as f:
            lines = f.read().splitlines()
        for line in lines:
            num, _, rest = line.partition(b":")
            controllers, _, path = rest.partition(b":")
            pids = b"pids" in controllers.split(b",") or (num == b"0" and not controllers)
            if pids and path.endswith(b"/" + tail) and folder.endswith(path):
                return
        raise OSError(errno.ESRCH, f"not in its group {folder.decode()} after the host's join")

    def _drop_caps(self) -> None:
        prctl = self._prctl
        prctl(PR_SET_SECUREBITS, SECURE_NOROOT, 0, 0, 0)  # needs CAP_SETPCAP: before the drop
        for cap in range(self._last_cap + 1):
            prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)
        prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
        if self._capset(cabi.byref(self._cap_header), self._cap_data) == 0:
            self.report["caps"] = True
        else:
            self._fail("capabilities", OSError(cabi.get_errno(), "capset refused"))

    def _send(self) -> None:
        listener, self.listener = self.listener, -1
        channel = self.walls.channel
        if channel < 0:
            if listener >= 0:  # nobody to answer: every connect fails (ENOSYS), never passes
                os.close(listener)
            return
        self.walls.channel = -1  # sent once
        payload = marshal.dumps(self.report)
        try:
            if listener >= 0:  # the gate's descriptor goes to the host; the worker keeps none
                import _socket

                sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_DGRAM, 0, channel)
                try:
                    rights = [
                        (
                            _socket.SOL_SOCKET,
                            _socket.SCM_RIGHTS,
                            listener.to_bytes(4, sys.byteorder),
                        )
                    ]
                    sock.sendmsg([payload], rights)
                finally:
                    sock.detach()
            else:
                os.write(channel, payload)
        except OSError as exc:
            self._fail("report", exc)
        finally:
            os.close(channel)
            if listener >= 0:
                os.close(listener)


def _no_prctl(*_args: int) -> int:
    """Where libc has no ``prctl``: every call fails (``ENOSYS``), so the report says so."""
    cabi.set_errno(38)
    return -1


def _netns():  # type: ignore[no-untyped-def]
    if __package__:
        from supervisor.processes import netns
    else:  # pragma: no cover - the shim
        import netns  # type: ignore[no-redef]
    return netns


def read_report(data: bytes) -> dict[str, object]:
    """The report :meth:`Armed.apply` sent (the host's side of the channel)."""
    try:
        report = marshal.loads(data)
    except (EOFError, TypeError, ValueError) as exc:
        raise ValueError("not a confinement report") from exc
    if not isinstance(report, dict):
        raise ValueError("not a confinement report")
    return report


def arm(walls: Walls) -> Armed:
    """Prepare ``walls`` in the parent (everything that allocates or may lock)."""
    return Armed(walls)
