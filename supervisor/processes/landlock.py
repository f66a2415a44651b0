"""Landlock (Linux 5.13+): the filesystem, TCP and IPC walls of a worker, built with raw
syscalls.

# Strategy: the standard library only (``ctypes``' pieces in :mod:`cabi`, ``os``, ``struct``),
# so the exec shim can load it without the virtual environment. :class:`Ruleset` is prepared in
# the parent (masks per ABI, the rule buffers, the bound ``syscall``), and its two child-side
# steps, :meth:`Ruleset.build` (open each path ``O_PATH``, add a rule, close) and
# :meth:`Ruleset.restrict`, allocate next to nothing and call no lock-taking code, so they are
# safe in a child forked from a threaded process. A path that does not exist is skipped and
# reported; a grant on a file gets the file rights only (the kernel refuses folder rights on a
# file). Everything the ABI knows is *handled*, so whatever no rule grants is denied: the
# kernel answers ``EACCES``.
"""

from __future__ import annotations

import os
import stat
import struct
import sys

if __package__:  # inside the package
    from supervisor.processes import cabi
else:  # pragma: no cover - loaded by the exec shim from this folder (never the package's copy)
    import cabi  # type: ignore[no-redef]

TYPE_CHECKING = False  # not typing's: the shim imports nothing it does not need
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

SYS_CREATE_RULESET = 444
SYS_ADD_RULE = 445
SYS_RESTRICT_SELF = 446
"""The same numbers on every architecture (syscalls added after the tables were unified)."""
CREATE_RULESET_VERSION = 1 << 0

EXECUTE = 1 << 0
WRITE_FILE = 1 << 1
READ_FILE = 1 << 2
READ_DIR = 1 << 3
REMOVE_DIR = 1 << 4
REMOVE_FILE = 1 << 5
MAKE_CHAR = 1 << 6
MAKE_DIR = 1 << 7
MAKE_REG = 1 << 8
MAKE_SOCK = 1 << 9
MAKE_FIFO = 1 << 10
MAKE_BLOCK = 1 << 11
MAKE_SYM = 1 << 12
REFER = 1 << 13  # ABI 2
TRUNCATE = 1 << 14  # ABI 3
IOCTL_DEV = 1 << 15  # ABI 5

NET_BIND_TCP = 1 << 0  # ABI 4
NET_CONNECT_TCP = 1 << 1

SCOPE_ABSTRACT_UNIX_SOCKET = 1 << 0  # ABI 6
SCOPE_SIGNAL = 1 << 1

RULE_PATH_BENEATH = 1
RULE_NET_PORT = 2

RESTRICT_SELF_LOG_NEW_EXEC_ON = 1 << 1  # ABI 7: denials after exec go to the audit log

FILE_RIGHTS = EXECUTE | WRITE_FILE | READ_FILE | TRUNCATE | IOCTL_DEV
"""The only rights a rule on a non-folder may carry."""
READ = EXECUTE | READ_FILE | READ_DIR
WRITE = (
    READ
    | WRITE_FILE
    | REMOVE_DIR
    | REMOVE_FILE
    | MAKE_DIR
    | MAKE_REG
    | MAKE_SOCK
    | MAKE_FIFO
    | MAKE_SYM
    | REFER
    | TRUNCATE
)
"""Read-write grants: everything but device nodes (``MAKE_CHAR``, ``MAKE_BLOCK``) and device
ioctls."""
DEVICE = READ_FILE | WRITE_FILE | TRUNCATE | IOCTL_DEV
"""``/dev/null`` and friends: read, write and their ioctls."""

O_PATH = getattr(os, "O_PATH", 0o10000000)


def fs_rights(abi: int) -> int:
    """Every filesystem right ABI ``abi`` knows (all handled: denied unless granted)."""
    if abi < 1:
        return 0
    top = {1: REFER, 2: TRUNCATE, 3: IOCTL_DEV, 4: IOCTL_DEV}.get(abi, IOCTL_DEV << 1)
    return top - 1


_libc: cabi.CDLL | None = None


def _syscall() -> Callable[..., int] | None:
    global _libc
    if not sys.platform.startswith("linux"):
        return None
    if _libc is None:
        try:
            _libc = cabi.CDLL(None)
        except OSError:
            return None
    fn = _libc.syscall
    fn.restype = cabi.c_long
    syscall: Callable[..., int] = fn
    return syscall


def abi_version() -> int:
    """The running kernel's Landlock ABI (0: not available, disabled or not in ``lsm=``)."""
    fn = _syscall()
    if fn is None:
        return 0
    r = fn(cabi.c_long(SYS_CREATE_RULESET), None, cabi.c_long(0), cabi.c_long(1))
    return max(int(r), 0)


class Ruleset:
    """One worker's Landlock domain, prepared in the parent and built in the child.

    Args:
        abi: The ABI to build for (:func:`abi_version`, or lower).
        read: Paths granted read and execute.
        write: Paths granted read, execute and every write right but device nodes.
        devices: Device files granted read, write and ioctl (``/dev/null``).
        tcp_connect: With ABI 4+, the only TCP ports ``connect`` may reach (``bind`` is then
            refused everywhere); None leaves TCP alone.
        scoped: With ABI 6+, refuse signals to, and abstract Unix sockets of, every process
            outside the domain (the host, other sidecars).
        audit: With ABI 7+, log denials of the exec'd program to the kernel's audit log.
    """

    def __init__(
        self,
        abi: int,
        *,
        read: Sequence[str],
        write: Sequence[str],
        devices: Sequence[str] = (),
        listed: Sequence[str] = (),
        tcp_connect: Sequence[int] | None = None,
        scoped: bool = True,
        audit: bool = True,
    ) -> None:
        self.abi = abi
        handled = fs_rights(abi)
        self.grants: list[tuple[bytes, int]] = [
            *((os.fsencode(p), handled & DEVICE) for p in devices),
            *((os.fsencode(p), handled & WRITE) for p in write),
            *((os.fsencode(p), handled & READ) for p in read),
            *((os.fsencode(p), handled & READ_DIR) for p in listed),
        ]
        self.handled_net = (
            NET_BIND_TCP | NET_CONNECT_TCP if tcp_connect is not None and abi >= 4 else 0
        )
        self.ports = [p for p in (tcp_connect or ()) if 0 < p < 65536] if self.handled_net else []
        self.scoped = SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL if scoped and abi >= 6 else 0
        size = 24 if abi >= 6 else 16 if abi >= 4 else 8
        self._attr = cabi.create_string_buffer(
            struct.pack("=QQQ", handled, self.handled_net, self.scoped)[:size], size
        )
        self._attr_size = size
        self._path_rule = cabi.create_string_buffer(
            12
        )  # struct landlock_path_beneath_attr (packed)
        self._net_rule = cabi.create_string_buffer(16)  # struct landlock_net_port_attr
        self._flags = RESTRICT_SELF_LOG_NEW_EXEC_ON if audit and abi >= 7 else 0
        self._sys = _syscall()
        self.fd = -1
        self.rules = 0
        self.skipped: list[str] = []

    @classmethod
    def entering(cls, abi: int, fd: int, *, audit: bool = True) -> Ruleset:
        """A ruleset built elsewhere (in the parent, once per sidecar), inherited as ``fd``:
        :meth:`restrict` only enters it (microseconds; the rules are not rebuilt per worker)."""
        ruleset = cls(abi, read=(), write=(), audit=audit)
        ruleset.fd = fd
        return ruleset

    def build(self) -> int:
        """Create the ruleset and add every rule (in the parent, once per sidecar, or in the
        child before its privileges go).

        Returns:
            The ruleset's descriptor (close-on-exec; ``rules`` counts what was added, paths
            that could not be opened are in ``skipped``). Built in the parent, it serves any
            number of children (:meth:`entering`).

        Raises:
            OSError: The kernel refused the ruleset itself.
        """
        fn = self._sys
        if fn is None or self.abi < 1:
            raise OSError(38, "Landlock is not available")
        fd = fn(
            cabi.c_long(SYS_CREATE_RULESET),
            self._attr,
            cabi.c_long(self._attr_size),
            cabi.c_long(0),
        )
        if fd < 0:
            err = cabi.get_errno()
            raise OSError(err, f"landlock_create_ruleset: {os.strerror(err)}")
        self.fd = int(fd)
        rule = self._path_rule
        for path, access in self.grants:
            try:
                pfd = os.open(path, O_PATH | os.O_CLOEXEC)
            except OSError:
                self.skipped.append(os.fsdecode(path))
                continue
            try:
                if not stat.S_ISDIR(os.fstat(pfd).st_mode):
                    access &= FILE_RIGHTS
                struct.pack_into("=Qi", rule, 0, access, pfd)
                r = fn(
                    cabi.c_long(SYS_ADD_RULE),
                    cabi.c_long(self.fd),
                    cabi.c_long(RULE_PATH_BENEATH),
                    rule,
                    cabi.c_long(0),
                )
                if r == 0:
                    self.rules += 1
                else:
                    self.skipped.append(os.fsdecode(path))
            finally:
                os.close(pfd)
        net = self._net_rule
        for port in self.ports:
            struct.pack_into("=QQ", net, 0, NET_CONNECT_TCP, port)
            r = fn(
                cabi.c_long(SYS_ADD_RULE),
                cabi.c_long(self.fd),
                cabi.c_long(RULE_NET_PORT),
                net,
                cabi.c_long(0),
            )
            if r == 0:
                self.rules += 1
        return self.fd

    def restrict(self) -> None:
        """Enter the domain (needs ``no_new_privs`` or ``CAP_SYS_ADMIN``); irreversible.

        Raises:
            OSError: The kernel refused.
        """
        fn = self._sys
        assert fn is not None and self.fd >= 0
        flags = self._flags
        r = fn(cabi.c_long(SYS_RESTRICT_SELF), cabi.c_long(self.fd), cabi.c_long(flags))
        if r != 0 and flags and cabi.get_errno() == 22:  # a kernel without the log flags
            r = fn(cabi.c_long(SYS_RESTRICT_SELF), cabi.c_long(self.fd), cabi.c_long(0))
        err = cabi.get_errno()
        os.close(self.fd)
        self.fd = -1
        if r != 0:
            raise OSError(err, f"landlock_restrict_self: {os.strerror(err)}")
