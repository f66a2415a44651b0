"""A network namespace of the worker's own: no interface but its loopback, so nothing it does
reaches the host's network; what it may reach is handed in as listening sockets the host serves.

# Strategy: the standard library only (the exec shim loads it without the virtual environment).
# In the child, before its privileges go: as root ``unshare(CLONE_NEWNET)``; as a normal user a
# user namespace first (``CLONE_NEWUSER | CLONE_NEWNET``, its own uid and gid mapped to
# themselves, ``setgroups`` denied), whose capabilities are dropped right after with the rest.
# Then ``lo`` is brought up and one listening TCP socket is made on 127.0.0.1 for each port the
# worker may reach (the egress proxy's, each ``loopback`` port): those sockets live in the
# worker's namespace, and the host, which gets them over a Unix socket (``SCM_RIGHTS``), accepts
# on them from outside it. Nobody else can reach them, so a listener *is* the worker's
# identity: the proxy needs no token, and a sidecar cannot pass for another.
"""

from __future__ import annotations

import ctypes
import fcntl
import os
import socket
import struct

CLONE_NEWNET = 0x40000000
CLONE_NEWUSER = 0x10000000
SIOCGIFFLAGS = 0x8913
SIOCSIFFLAGS = 0x8914
IFF_UP = 0x1


class Namespace:
    """A new network namespace for the calling process, prepared in the parent.

    Args:
        way: ``root`` (``unshare(CLONE_NEWNET)``) or ``user`` (a user namespace first).
        ports: Loopback ports to listen on inside it (the proxy's, granted loopback ports).
    """

    def __init__(self, way: str, ports: list[int]) -> None:
        self.way = way
        self.ports = list(ports)
        self.uid_map = b"%d %d 1" % (os.getuid(), os.getuid())
        self.gid_map = b"%d %d 1" % (os.getgid(), os.getgid())
        libc = ctypes.CDLL(None, use_errno=True)
        self._unshare = libc.unshare
        self._unshare.argtypes = [ctypes.c_int]
        self._unshare.restype = ctypes.c_int
        self._ifreq = bytearray(struct.pack("16sH22x", b"lo", 0))
        self.listeners: list[socket.socket] = []

    def enter(self) -> None:
        """Unshare, map ids (user way), bring ``lo`` up, listen on the ports (in the child).

        Raises:
            OSError: Any step failed (the caller decides whether the worker may go on).
        """
        flags = CLONE_NEWNET | (CLONE_NEWUSER if self.way == "user" else 0)
        if self._unshare(flags) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"unshare(network namespace): {os.strerror(err)}")
        if self.way == "user":
            _write("/proc/self/setgroups", b"deny")
            _write("/proc/self/uid_map", self.uid_map)
            _write("/proc/self/gid_map", self.gid_map)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            req = self._ifreq
            fcntl.ioctl(s.fileno(), SIOCGIFFLAGS, req)
            flags_now = struct.unpack_from("H", req, 16)[0]
            struct.pack_into("H", req, 16, flags_now | IFF_UP)
            fcntl.ioctl(s.fileno(), SIOCSIFFLAGS, req)
        for port in self.ports:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(("127.0.0.1", port))
            sock.listen(128)
            self.listeners.append(sock)

    def release(self) -> None:
        """Close the child's copies of the listeners (after they were sent to the host)."""
        for sock in self.listeners:
            sock.close()
        self.listeners = []


def _write(path: str, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


_PROBE = """
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
if libc.unshare(0x40000000 | 0x10000000) != 0:
    sys.exit(1)
for path, data in (("setgroups", b"deny"), ("uid_map", b"%d %d 1" % (int(sys.argv[1]),) * 2)):
    fd = os.open("/proc/self/" + path, os.O_WRONLY)
    os.write(fd, data)
    os.close(fd)
"""


def probe_user() -> bool:
    """A normal user may make a user and a network namespace here (tried once, in a fresh
    interpreter: forking the host, which may have threads, to try it would not be safe)."""
    import subprocess
    import sys

    try:
        done = subprocess.run(
            [sys.executable, "-I", "-S", "-c", _PROBE, str(os.getuid())],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return False
    return done.returncode == 0
