"""The syscall filter of every worker: a classic BPF program built as bytes, installed with
``no_new_privs``.

# Strategy: the standard library only (the exec shim loads it without the virtual environment).
# :func:`program` assembles the filter in the parent from a small per-architecture table;
# :class:`Filter` keeps the bytes and the ``sock_fprog`` in ctypes buffers so the child's one
# call, :meth:`Filter.install`, is a single ``prctl``. Refused syscalls fail with ``EPERM``
# (``clone3`` with ``ENOSYS``, so libc falls back to ``clone``, whose flags the filter can read);
# any other architecture's syscalls (an x86_64 process using the i386 or x32 ABI) fail with
# ``EPERM`` too. What it refuses: ptrace and reading or writing another process's memory,
# mounts, new namespaces (``unshare``, ``setns``, ``clone`` with a ``CLONE_NEW*`` flag), kernel
# keyrings, module loading, ``bpf``, ``perf_event_open``, ``kexec``, ``userfaultfd``,
# ``io_uring`` (its operations bypass this filter), and ``socket(AF_UNIX)`` unless the profile
# grants Unix sockets (``socketpair`` stays: trio needs it; but not a datagram pair, which
# could send to any datagram socket by its path). Without a network namespace it also
# limits which socket families may be created (``SocketFilter``).
"""

from __future__ import annotations

import os
import struct
import sys

if __package__:  # inside the package
    from supervisor.processes import cabi, linux
else:  # pragma: no cover - loaded by the exec shim from this folder (never the package's copy)
    import cabi  # type: ignore[no-redef]
    import linux  # type: ignore[no-redef]

AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}

DENIED = (
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "mount",
    "umount2",
    "pivot_root",
    "chroot",
    "open_tree",
    "move_mount",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "mount_setattr",
    "unshare",
    "setns",
    "keyctl",
    "add_key",
    "request_key",
    "init_module",
    "finit_module",
    "delete_module",
    "bpf",
    "perf_event_open",
    "kexec_load",
    "kexec_file_load",
    "userfaultfd",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
)
"""Refused with ``EPERM`` whatever their arguments."""

SYSCALLS: dict[str, dict[str, int]] = {
    "x86_64": {
        "ptrace": 101,
        "process_vm_readv": 310,
        "process_vm_writev": 311,
        "mount": 165,
        "umount2": 166,
        "pivot_root": 155,
        "chroot": 161,
        "unshare": 272,
        "setns": 308,
        "keyctl": 250,
        "add_key": 248,
        "request_key": 249,
        "init_module": 175,
        "finit_module": 313,
        "delete_module": 176,
        "bpf": 321,
        "perf_event_open": 298,
        "kexec_load": 246,
        "kexec_file_load": 320,
        "userfaultfd": 323,
        "clone": 56,
        "socket": 41,
        "socketpair": 53,
        "connect": 42,
        "seccomp": 317,
    },
    "aarch64": {
        "ptrace": 117,
        "process_vm_readv": 270,
        "process_vm_writev": 271,
        "mount": 40,
        "umount2": 39,
        "pivot_root": 41,
        "chroot": 51,
        "unshare": 97,
        "setns": 268,
        "keyctl": 219,
        "add_key": 217,
        "request_key": 218,
        "init_module": 105,
        "finit_module": 273,
        "delete_module": 106,
        "bpf": 280,
        "perf_event_open": 241,
        "kexec_load": 104,
        "kexec_file_load": 294,
        "userfaultfd": 282,
        "clone": 220,
        "socket": 198,
        "socketpair": 199,
        "connect": 203,
        "seccomp": 277,
    },
}
COMMON = {  # added after the tables were unified: the same number everywhere
    "io_uring_setup": 425,
    "io_uring_enter": 426,
    "io_uring_register": 427,
    "open_tree": 428,
    "move_mount": 429,
    "fsopen": 430,
    "fsconfig": 431,
    "fsmount": 432,
    "fspick": 433,
    "clone3": 435,
    "mount_setattr": 442,
}
X32_BIT = 0x40000000

CLONE_NEW = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000
"""CLONE_NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET."""
AF_UNIX, AF_INET, AF_INET6 = 1, 2, 10
SOCK_STREAM, SOCK_DGRAM, SOCK_TYPE_MASK = 1, 2, 0xF
EPERM, ENOSYS = 1, 38

RET_ALLOW = 0x7FFF0000
RET_USER_NOTIF = 0x7FC00000
RET_ERRNO = 0x00050000

# classic BPF opcodes
LD_W_ABS = 0x00 | 0x00 | 0x20
JEQ_K = 0x05 | 0x10
JGE_K = 0x05 | 0x30
JSET_K = 0x05 | 0x40
AND_K = 0x04 | 0x50
RET_K = 0x06

OFF_NR, OFF_ARCH, OFF_ARG0, OFF_ARG1 = 0, 4, 16, 24  # struct seccomp_data (low words: LE)

PR_SET_NO_NEW_PRIVS = 38
PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2
SECCOMP_SET_MODE_FILTER = 1
SECCOMP_FILTER_FLAG_NEW_LISTENER = 1 << 3


def arch() -> str:
    """This machine's architecture if the filter has a table for it, else ``""``."""
    machine = os.uname().machine.lower()
    machine = {"amd64": "x86_64", "arm64": "aarch64"}.get(machine, machine)
    return machine if machine in SYSCALLS and sys.byteorder == "little" else ""


class _Asm:
    """A tiny assembler: instructions with jumps to labels, resolved to relative offsets."""

    def __init__(self) -> None:
        self.code: list[tuple[int, str | int, str | int, int]] = []
        self.labels: dict[str, int] = {}

    def label(self, name: str) -> None:
        self.labels[name] = len(self.code)

    def op(self, code: int, k: int, jt: str | int = 0, jf: str | int = 0) -> None:
        self.code.append((code, jt, jf, k))

    def bytes(self) -> bytes:
        out = bytearray()
        for i, (code, jt, jf, k) in enumerate(self.code):
            t = self.labels[jt] - i - 1 if isinstance(jt, str) else jt
            f = self.labels[jf] - i - 1 if isinstance(jf, str) else jf
            if not (0 <= t <= 255 and 0 <= f <= 255):
                raise ValueError("seccomp program: jump out of range")
            out += struct.pack("=HBBI", code, t, f, k & 0xFFFFFFFF)
        return bytes(out)


def program(arch_name: str, *, allow_unix: bool, sockets: str = "any", gate: bool = False) -> bytes:
    """The filter for ``arch_name``.

    Args:
        arch_name: ``x86_64`` or ``aarch64``.
        allow_unix: Let ``socket(AF_UNIX, ...)`` through.
        sockets: Other families: ``any``; ``stream`` (only TCP over IPv4/IPv6); ``none``.
        gate: Every ``connect`` waits for the host's answer (a user notification: the host's
            Unix socket gate, ``host/unix_gate.py``, checks the address against the ``unix``
            grants and connects the socket itself); Unix datagram sockets are refused (a
            datagram reaches any socket by ``sendto``, past the gate).

    Returns:
        The ``struct sock_filter`` array as bytes.
    """
    table = {**SYSCALLS[arch_name], **COMMON}
    a = _Asm()
    a.op(LD_W_ABS, OFF_ARCH)
    a.op(JEQ_K, AUDIT_ARCH[arch_name], 0, "eperm")
    a.op(LD_W_ABS, OFF_NR)
    if arch_name == "x86_64":
        a.op(JGE_K, X32_BIT, "eperm", 0)
    a.op(JEQ_K, table["clone3"], "enosys", 0)
    for name in DENIED:
        a.op(JEQ_K, table[name], "eperm", 0)
    a.op(JEQ_K, table["clone"], "clone", 0)
    if gate:
        a.op(JEQ_K, table["connect"], "notify", 0)
    filter_sockets = not allow_unix or sockets != "any" or gate
    if filter_sockets:
        a.op(JEQ_K, table["socket"], "socket", 0)
    if not allow_unix or gate:
        a.op(JEQ_K, table["socketpair"], "pair", 0)
    a.op(RET_K, RET_ALLOW)
    if gate:
        a.label("notify")
        a.op(RET_K, RET_USER_NOTIF)
    if not allow_unix or gate:
        # A datagram pair may still send to any datagram socket by its path (sendto: journald,
        # /dev/log, a notify socket), past every other wall: refused. Stream and seqpacket
        # pairs cannot address anyone but their peer.
        a.label("pair")
        a.op(LD_W_ABS, OFF_ARG0)
        a.op(JEQ_K, AF_UNIX, 0, "allow")
        a.op(LD_W_ABS, OFF_ARG1)
        a.op(AND_K, SOCK_TYPE_MASK)
        a.op(JEQ_K, SOCK_DGRAM, "eperm", "allow")
    a.label("clone")
    a.op(LD_W_ABS, OFF_ARG0)
    a.op(JSET_K, CLONE_NEW, "eperm", 0)
    a.op(RET_K, RET_ALLOW)
    if filter_sockets:
        a.label("socket")
        a.op(LD_W_ABS, OFF_ARG0)
        a.op(JEQ_K, AF_UNIX, ("unix_type" if gate else "allow") if allow_unix else "eperm", 0)
        if sockets == "any":
            a.op(RET_K, RET_ALLOW)
        elif sockets == "stream":
            a.op(JEQ_K, AF_INET, "type", 0)
            a.op(JEQ_K, AF_INET6, "type", "eperm")
            a.label("type")
            a.op(LD_W_ABS, OFF_ARG1)
            a.op(AND_K, SOCK_TYPE_MASK)
            a.op(JEQ_K, SOCK_STREAM, "allow", "eperm")
        else:
            a.op(RET_K, RET_ERRNO | EPERM)
        if allow_unix and gate:  # (forward jumps only: the pair block's check is behind)
            a.label("unix_type")
            a.op(LD_W_ABS, OFF_ARG1)
            a.op(AND_K, SOCK_TYPE_MASK)
            a.op(JEQ_K, SOCK_DGRAM, "eperm", "allow")
    a.label("allow")
    a.op(RET_K, RET_ALLOW)
    a.label("eperm")
    a.op(RET_K, RET_ERRNO | EPERM)
    a.label("enosys")
    a.op(RET_K, RET_ERRNO | ENOSYS)
    return a.bytes()


class _SockFprog(cabi.Structure):
    _fields_ = [("len", cabi.c_ushort), ("filter", cabi.c_void_p)]


class Filter:
    """A filter ready to install: built in the parent, one ``prctl`` in the child."""

    def __init__(self, code: bytes, arch_name: str = "") -> None:
        self._buf = cabi.create_string_buffer(code, len(code))
        self._prog = _SockFprog(len(code) // 8, cabi.addressof(self._buf))
        self._ptr = cabi.addressof(self._prog)
        self._prctl = linux.PRCTL
        self._seccomp_nr = SYSCALLS[arch_name]["seccomp"] if arch_name else -1
        self._syscall = cabi.CDLL(None).syscall if arch_name else None

    def install(self, listener: bool = False) -> int:
        """Set ``no_new_privs`` and install the filter (irreversible); with ``listener`` (a
        filter that notifies: ``program(gate=True)``) returns the notification descriptor for
        the host (the caller must pass it on and close it), else -1.

        Raises:
            OSError: The kernel refused.
        """
        prctl = self._prctl
        if prctl is None:
            raise OSError(38, "prctl is not available")
        if prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            err = cabi.get_errno()
            raise OSError(err, "prctl(PR_SET_NO_NEW_PRIVS) refused")
        if listener:
            if self._syscall is None:
                raise OSError(38, "seccomp(2) is not available")
            fd = int(
                self._syscall(
                    self._seccomp_nr,
                    SECCOMP_SET_MODE_FILTER,
                    SECCOMP_FILTER_FLAG_NEW_LISTENER,
                    cabi.c_void_p(self._ptr),
                )
            )
            if fd < 0:
                err = cabi.get_errno()
                raise OSError(err, "seccomp(SECCOMP_FILTER_FLAG_NEW_LISTENER) refused")
            return fd
        if prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, self._ptr, 0, 0) != 0:
            err = cabi.get_errno()
            raise OSError(err, "prctl(PR_SET_SECCOMP) refused")
        return -1


def available() -> bool:
    """Seccomp filters can be installed here (``/proc/self/status`` has a ``Seccomp`` line and
    the kernel knows ``SECCOMP_MODE_FILTER``)."""
    try:
        with open("/proc/self/status", "rb") as f:
            if b"\nSeccomp:" not in f.read():
                return False
    except OSError:
        return False
    prctl = linux.PRCTL
    if prctl is None:
        return False
    # PR_GET_SECCOMP answers 0 (none) or 2 (filter) when the kernel has seccomp at all.
    return int(prctl(21, 0, 0, 0, 0)) in (0, 2)
