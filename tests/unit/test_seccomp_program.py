"""The syscall filter's BPF program, run on a small BPF interpreter: every decision for both
architectures, without installing anything."""

from __future__ import annotations

import struct

import pytest

from supervisor.processes import landlock
from supervisor.processes.seccomp import (
    AUDIT_ARCH,
    COMMON,
    DENIED,
    ENOSYS,
    EPERM,
    RET_ALLOW,
    RET_ERRNO,
    RET_USER_NOTIF,
    SYSCALLS,
    program,
)

ALLOW, DENY, NOSYS = RET_ALLOW, RET_ERRNO | EPERM, RET_ERRNO | ENOSYS


def run(code: bytes, nr: int, arch: int, args: tuple[int, ...] = ()) -> int:
    """Evaluate a classic BPF seccomp program on one ``struct seccomp_data``."""
    data = struct.pack("=iIQ6Q", nr, arch, 0, *(list(args) + [0] * (6 - len(args))))
    insns = [struct.unpack_from("=HBBI", code, i) for i in range(0, len(code), 8)]
    acc, pc = 0, 0
    while True:
        op, jt, jf, k = insns[pc]
        if op == 0x20:  # ld w abs
            acc = struct.unpack_from("=I", data, k)[0]
        elif op == 0x54:  # alu and k
            acc &= k
        elif op in (0x15, 0x35, 0x45):  # jeq, jge, jset
            hit = {0x15: acc == k, 0x35: acc >= k, 0x45: bool(acc & k)}[op]
            pc += jt if hit else jf
        elif op == 0x06:
            return k
        else:  # pragma: no cover
            raise AssertionError(f"unknown opcode {op:#x}")
        pc += 1


@pytest.mark.parametrize("arch", sorted(SYSCALLS))
@pytest.mark.parametrize("name", DENIED)
def test_denied_syscalls_fail_with_eperm(arch: str, name: str) -> None:
    code = program(arch, allow_unix=True)
    nr = {**SYSCALLS[arch], **COMMON}[name]
    assert run(code, nr, AUDIT_ARCH[arch]) == DENY


@pytest.mark.parametrize("arch", sorted(SYSCALLS))
def test_clone_namespaces_clone3_and_other_abis(arch: str) -> None:
    code = program(arch, allow_unix=True)
    table, audit = SYSCALLS[arch], AUDIT_ARCH[arch]
    thread = (
        0x3D0F00  # CLONE_VM|FS|FILES|SIGHAND|THREAD|SYSVSEM|SETTLS|PARENT_SETTID|CHILD_CLEARTID
    )
    assert run(code, table["clone"], audit, (thread,)) == ALLOW
    assert run(code, table["clone"], audit, (0x11,)) == ALLOW  # fork: SIGCHLD
    for flag in (0x20000, 0x10000000, 0x40000000, 0x20000000):
        assert run(code, table["clone"], audit, (thread | flag,)) == DENY
    assert run(code, COMMON["clone3"], audit) == NOSYS  # libc falls back to clone
    assert run(code, 0, audit) == ALLOW  # read / io_setup
    other = next(a for n, a in AUDIT_ARCH.items() if n != arch)
    assert run(code, 0, other) == DENY
    assert run(code, 0, 0x40000003) == DENY  # i386
    if arch == "x86_64":
        assert run(code, 0x40000000 | 41, audit) == DENY  # x32


@pytest.mark.parametrize(
    ("allow_unix", "sockets", "family", "kind", "expected"),
    [
        (True, "any", 1, 1, ALLOW),
        (False, "any", 1, 1, DENY),
        (False, "any", 1, 2 | 0o2000000, DENY),
        (False, "any", 2, 1, ALLOW),
        (False, "any", 16, 3, ALLOW),
        (False, "none", 2, 1, DENY),
        (False, "none", 10, 2, DENY),
        (False, "none", 16, 3, DENY),  # netlink
        (True, "none", 1, 1, ALLOW),
        (False, "stream", 2, 1, ALLOW),
        (False, "stream", 10, 1 | 0o4000 | 0o2000000, ALLOW),  # SOCK_NONBLOCK | SOCK_CLOEXEC
        (False, "stream", 2, 2, DENY),  # UDP
        (False, "stream", 2, 3, DENY),  # raw
        (False, "stream", 17, 3, DENY),  # packet
        (False, "stream", 1, 1, DENY),
    ],
)
def test_socket_rules(
    allow_unix: bool, sockets: str, family: int, kind: int, expected: int
) -> None:
    for arch in SYSCALLS:
        code = program(arch, allow_unix=allow_unix, sockets=sockets)
        assert run(code, SYSCALLS[arch]["socket"], AUDIT_ARCH[arch], (family, kind, 0)) == expected


@pytest.mark.parametrize("arch", sorted(SYSCALLS))
def test_socketpair_stream_always_datagram_only_with_an_ungated_unix_grant(arch: str) -> None:
    pair, audit = SYSCALLS[arch]["socketpair"], AUDIT_ARCH[arch]
    for allow_unix, gate, dgram in ((False, False, DENY), (True, False, ALLOW), (True, True, DENY)):
        code = program(arch, allow_unix=allow_unix, sockets="none", gate=gate)
        assert run(code, pair, audit, (1, 1, 0)) == ALLOW  # stream: trio's wakeup pair
        assert run(code, pair, audit, (1, 5, 0)) == ALLOW  # seqpacket
        assert run(code, pair, audit, (1, 2 | 0o2000000, 0)) == dgram  # SOCK_DGRAM|CLOEXEC


@pytest.mark.parametrize("arch", sorted(SYSCALLS))
def test_the_gate_asks_the_host_for_every_connect(arch: str) -> None:
    table, audit = SYSCALLS[arch], AUDIT_ARCH[arch]
    for sockets in ("any", "stream", "none"):
        gated = program(arch, allow_unix=True, sockets=sockets, gate=True)
        assert run(gated, table["connect"], audit, (3, 0, 110)) == RET_USER_NOTIF
        assert run(gated, table["socket"], audit, (1, 1, 0)) == ALLOW
        assert run(gated, table["socket"], audit, (1, 2, 0)) == DENY  # a datagram skips connect
        assert run(gated, table["ptrace"], audit) == DENY
        plain = program(arch, allow_unix=True, sockets=sockets)
        assert run(plain, table["connect"], audit, (3, 0, 110)) == ALLOW


@pytest.mark.parametrize(
    ("abi", "top"),
    [
        (0, 0),
        (1, landlock.MAKE_SYM),
        (2, landlock.REFER),
        (3, landlock.TRUNCATE),
        (4, landlock.TRUNCATE),
        (5, landlock.IOCTL_DEV),
        (7, landlock.IOCTL_DEV),
    ],
)
def test_landlock_rights_per_abi(abi: int, top: int) -> None:
    rights = landlock.fs_rights(abi)
    assert rights == (top << 1) - 1 if top else rights == 0
    assert landlock.WRITE & ~landlock.fs_rights(7) == 0
    assert not landlock.WRITE & (landlock.MAKE_CHAR | landlock.MAKE_BLOCK | landlock.IOCTL_DEV)
