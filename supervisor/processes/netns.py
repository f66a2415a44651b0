"""A network namespace per sidecar: no interface but its loopback, so nothing its workers do
reaches the host's network; what they may reach is a listening socket the host serves.

# Strategy: the standard library only (the exec shim loads it without the virtual environment).
# Making a namespace costs milliseconds (``unshare(CLONE_NEWNET)`` waits on the kernel's network
# setup), joining one costs microseconds, so the host makes one per sidecar, once:
# :meth:`Holder.create` runs this file as a tiny helper (``python -I -S netns.py``) that unshares
# (as a normal user a user namespace first, its own uid and gid mapped to themselves,
# ``setgroups`` denied), brings ``lo`` up, listens on 127.0.0.1 for each port its workers may
# reach (the egress proxy's, each ``loopback`` port), and sends the listeners and its namespace
# descriptors to the host over a Unix socket (``SCM_RIGHTS``) before it exits. The host holds
# them (the namespace lives as long as a descriptor does) and accepts on the listeners from
# outside the namespace. Each worker joins with ``setns`` between fork and exec (:class:`Join`),
# before its capabilities go. Nothing but the sidecar's workers is in the namespace, so a
# listener *is* the sidecar's identity: the proxy needs no token, and a sidecar cannot pass for
# another.
"""

from __future__ import annotations

import os
import sys

if __package__:  # inside the package
    from supervisor.processes import cabi
else:  # pragma: no cover - the exec shim loads it from this folder, or it runs as the helper
    if __name__ == "__main__":  # ``python -I -S netns.py``: no folder of its own on sys.path
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import cabi  # type: ignore[no-redef]

TYPE_CHECKING = False  # not typing's: the shim imports nothing it does not need
if TYPE_CHECKING:
    import socket

CLONE_NEWNET = 0x40000000
CLONE_NEWUSER = 0x10000000
SIOCGIFFLAGS = 0x8913
SIOCSIFFLAGS = 0x8914
IFF_UP = 0x1


def _libc() -> cabi.CDLL:
    return cabi.CDLL(None)


class Join:
    """Joining a held namespace, prepared in the parent; :meth:`enter` in the child.

    Args:
        fds: The user namespace's descriptor first when there is one, then the network
            namespace's (inherited by the child).
    """

    def __init__(self, fds: list[int]) -> None:
        self.fds = list(fds)
        libc = _libc()
        self._setns = libc.setns
        self._setns.argtypes = [cabi.c_int, cabi.c_int]
        self._setns.restype = cabi.c_int

    def enter(self) -> None:
        """``setns`` into each namespace, in order (the calling process must be single-threaded).

        Raises:
            OSError: The kernel refused.
        """
        for fd in self.fds:
            if self._setns(fd, 0) != 0:
                err = cabi.get_errno()
                raise OSError(err, f"setns: {os.strerror(err)}")


class Holder:
    """One sidecar's network namespace, held by the host with its listeners.

    Attributes:
        way: ``root`` or ``user``.
        fds: Namespace descriptors to join, in order (:class:`Join`).
        listeners: ``port -> listening socket`` inside the namespace, owned by the host.
    """

    def __init__(self, way: str, fds: list[int], listeners: dict[int, socket.socket]) -> None:
        self.way = way
        self.fds = fds
        self.listeners = listeners

    @classmethod
    def create(cls, way: str, ports: list[int], python: str | None = None) -> Holder:
        """Make the namespace with a helper interpreter (one start, tens of milliseconds).

        Args:
            way: ``root`` (``unshare(CLONE_NEWNET)``) or ``user`` (a user namespace first).
            ports: Loopback ports to listen on inside it.
            python: The interpreter (default this one).

        Raises:
            OSError: The helper failed (its message says why).
        """
        import socket  # at run time only: the shim never makes a holder
        import subprocess

        parent, child = socket.socketpair()
        with parent, child:
            argv = [python or sys.executable, "-I", "-S", os.path.abspath(__file__)]
            argv += [way, str(child.fileno()), *map(str, ports)]
            done = subprocess.run(
                argv,
                pass_fds=[child.fileno()],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                timeout=30,
                check=False,
            )
            if done.returncode != 0:
                why = done.stderr.decode(errors="replace").strip().splitlines()
                raise OSError(1, f"network namespace: {why[-1] if why else done.returncode}")
            parent.setblocking(False)
            _, fds, _, _ = socket.recv_fds(parent, 16, 2 + len(ports))
        count = 2 if way == "user" else 1
        ns, sockets = fds[:count], fds[count:]
        for fd in ns:
            os.set_inheritable(fd, False)
        listeners = {
            port: socket.socket(fileno=fd) for port, fd in zip(ports, sockets, strict=True)
        }
        return cls(way, ns, listeners)

    def close(self) -> None:
        """Let the namespace go (once no worker is in it, the kernel frees it)."""
        for fd in self.fds:
            try:
                os.close(fd)
            except OSError:
                pass
        self.fds = []
        for sock in self.listeners.values():
            sock.close()
        self.listeners = {}


def _write(path: str, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def _helper(argv: list[str]) -> None:  # pragma: no cover - runs in the helper interpreter
    import fcntl
    import socket
    import struct

    way, channel, ports = argv[1], int(argv[2]), [int(p) for p in argv[3:]]
    uid, gid = os.getuid(), os.getgid()
    flags = CLONE_NEWNET | (CLONE_NEWUSER if way == "user" else 0)
    libc = _libc()
    if libc.unshare(flags) != 0:
        raise OSError(cabi.get_errno(), "unshare")
    if way == "user":
        _write("/proc/self/setgroups", b"deny")
        _write("/proc/self/uid_map", b"%d %d 1" % (uid, uid))
        _write("/proc/self/gid_map", b"%d %d 1" % (gid, gid))
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        req = bytearray(struct.pack("16sH22x", b"lo", 0))
        fcntl.ioctl(s.fileno(), SIOCGIFFLAGS, req)
        struct.pack_into("H", req, 16, struct.unpack_from("H", req, 16)[0] | IFF_UP)
        fcntl.ioctl(s.fileno(), SIOCSIFFLAGS, req)
    names = (["user"] if way == "user" else []) + ["net"]
    fds = [os.open(f"/proc/self/ns/{n}", os.O_RDONLY | os.O_CLOEXEC) for n in names]
    listeners = []
    for port in ports:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))
        sock.listen(128)
        listeners.append(sock)
    with socket.socket(fileno=channel) as out:
        socket.send_fds(out, [b"ns"], fds + [s.fileno() for s in listeners])


def probe_user() -> bool:
    """A normal user may make a user and a network namespace here (tried once, in a helper
    interpreter: forking the host, which may have threads, to try it would not be safe)."""
    try:
        Holder.create("user", []).close()
    except (OSError, ValueError):
        return False
    return True


if __name__ == "__main__":  # pragma: no cover - the helper
    try:
        _helper(sys.argv)
    except OSError as exc:
        sys.stderr.write(f"{exc}\n")
        sys.exit(1)
