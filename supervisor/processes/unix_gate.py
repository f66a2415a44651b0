"""The Unix socket gate, the kernel's side: what a gated worker's ``connect`` asks, and its answer.

# Strategy (docs/confinement.md, "Unix sockets"): Landlock (to ABI 7) does not control
# ``connect`` on a socket file, so a ``unix`` grant would open every pathname socket the worker
# can name. A worker whose profile grants ``unix`` paths installs its syscall filter with a
# user-notification listener (``seccomp.program(gate=True)``): every ``connect`` it or its
# children make waits until the host answers. The host reads the address from the worker's
# memory, takes the worker's own socket (``pidfd_getfd``: the same open socket, not a copy) and,
# when the address is allowed, connects that socket itself to the address *it* read and
# checked, then answers with the result. The host never answers "continue": the kernel would read
# the address again, and a second thread could have swapped it, or the descriptor, by then.
# An abstract address is refused (Landlock's scoping covers abstract sockets only for a connect
# the worker makes itself); a pathname one is allowed when its resolved path is a granted path
# or below a granted folder; a TCP one when the worker's Landlock rule lists the port (without
# a namespace of its own); anything else is connected as asked (the socket's own namespace
# and the filter's families are the walls there). Standard library only, no trio.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import functools
import os
import select
import socket
import stat
import struct

from supervisor.policy.confine import never_hit

IOCTL_RECV = 0xC0502100  # _IOWR('!', 0, struct seccomp_notif)
IOCTL_SEND = 0xC0182101  # _IOWR('!', 1, struct seccomp_notif_resp)
IOCTL_ID_VALID = 0x40082102  # _IOW('!', 2, __u64)
NOTIF = struct.Struct("=QIIiIQ6Q")  # id, pid, flags, nr, arch, ip, args[6]
RESP = struct.Struct("=QqiI")  # id, val, error, flags
PIDFD_GETFD = 438  # the same number on every architecture
_DIR_NOFOLLOW = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
MAX_ADDR = 128  # sizeof(struct sockaddr_storage)


class AbstractRefused(OSError):
    """An abstract (or unnamed) Unix address: refused without a word (every X client tries the
    abstract socket first, then the path)."""


class Rules:
    """What a gated worker may connect to.

    Args:
        unix: Granted socket paths (a folder grants what is below it), resolved.
        tcp_ports: The TCP ports its Landlock rule allows (None: TCP is not ruled by port:
            a namespace of its own, or the host's network).
        never: Paths no grant reaches (the plan's ``never``: the host's ``.toolhost/``, its
            kernel socket among them), even below a granted folder: a connect the gate makes
            carries the host's credentials, which the kernel socket's peer check trusts.
    """

    __slots__ = ("never", "tcp_ports", "unix")

    def __init__(
        self,
        unix: tuple[str, ...],
        tcp_ports: tuple[int, ...] | None,
        never: tuple[str, ...] = (),
    ) -> None:
        self.unix = tuple(os.path.realpath(p) for p in unix)
        self.tcp_ports = tcp_ports
        self.never = never

    def allows_path(self, path: str) -> bool:
        def within(root: str) -> bool:
            return path == root or path.startswith(root.rstrip("/") + "/")

        return any(within(g) for g in self.unix) and never_hit(path, self.never) is None

    def guarded(self) -> set[tuple[int, int]]:
        """The sockets of the never-granted paths, as (device, inode): a never-granted path or a
        socket directly in a never-granted folder (the kernel socket in ``.toolhost/``). Read
        at each check, so a socket made since counts too. A hard link (or a bind mount) of one
        of them inside a granted folder passes :meth:`allows_path` by its name; its inode does
        not pass :func:`_connect_path`."""
        found: set[tuple[int, int]] = set()
        for never in self.never:
            if "*" in never:
                continue
            try:
                st = os.lstat(never)
            except OSError:
                continue
            if stat.S_ISSOCK(st.st_mode):
                found.add((st.st_dev, st.st_ino))
            elif stat.S_ISDIR(st.st_mode):
                with contextlib.suppress(OSError), os.scandir(never) as entries:
                    for e in entries:
                        with contextlib.suppress(OSError):
                            est = e.stat(follow_symlinks=False)
                            if stat.S_ISSOCK(est.st_mode):
                                found.add((est.st_dev, est.st_ino))
        return found


class Request:
    """One notification: a ``connect(fd, addr, len)`` of process ``pid``."""

    __slots__ = ("addr", "fd", "id", "length", "pid")

    def __init__(self, raw: bytes) -> None:
        nid, pid, _flags, _nr, _arch, _ip, a0, a1, a2, *_rest = NOTIF.unpack(raw)
        self.id, self.pid = nid, pid
        self.fd, self.addr, self.length = a0 & 0xFFFFFFFF, a1, a2 & 0xFFFFFFFF


def receive(listener: int) -> Request | None:
    """The next notification, or None: none pending (its process went meanwhile), or the
    listener is done (every process behind it exited: ``POLLHUP``)."""
    poller = select.poll()
    poller.register(listener, select.POLLIN)
    events = poller.poll(0)
    if not events or not events[0][1] & select.POLLIN:
        return None
    buf = bytearray(NOTIF.size)
    try:
        fcntl.ioctl(listener, IOCTL_RECV, buf, True)
    except OSError:  # ENOENT: its process was killed before we took it
        return None
    return Request(bytes(buf))


def done(listener: int) -> bool:
    """Every process behind ``listener`` exited (nothing will come any more)."""
    poller = select.poll()
    poller.register(listener, select.POLLIN)
    events = poller.poll(0)
    return bool(events) and bool(events[0][1] & select.POLLHUP) and not events[0][1] & select.POLLIN


def answer(listener: int, req: Request, error: int) -> None:
    """Tell the worker its ``connect`` returned 0 (``error`` 0) or failed with ``error``."""
    with contextlib.suppress(OSError):  # ENOENT: it was killed meanwhile
        fcntl.ioctl(listener, IOCTL_SEND, RESP.pack(req.id, 0, -error if error else 0, 0))


def _valid(listener: int, req: Request) -> bool:
    try:
        fcntl.ioctl(listener, IOCTL_ID_VALID, struct.pack("=Q", req.id))
    except OSError:
        return False
    return True


@functools.cache
def _syscall():  # type: ignore[no-untyped-def]
    return ctypes.CDLL(None, use_errno=True).syscall


def _tgid(tid: int) -> int:
    """The process of thread ``tid`` (a notification names the thread that made the call;
    ``pidfd_open`` wants its process)."""
    with open(f"/proc/{tid}/status", "rb") as f:
        for line in f:
            if line.startswith(b"Tgid:"):
                return int(line.split()[1])
    raise OSError(errno.ESRCH, "no such process")


def _take_socket(pid: int, fd: int) -> socket.socket:
    """The worker's own socket (a new descriptor here for the same open socket)."""
    pidfd = os.pidfd_open(_tgid(pid))
    try:
        mine = int(_syscall()(PIDFD_GETFD, pidfd, fd, 0))
        if mine < 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))
    finally:
        os.close(pidfd)
    return socket.socket(fileno=mine)


def _read_address(pid: int, addr: int, length: int) -> bytes:
    if length <= 0 or addr == 0:
        raise OSError(errno.EFAULT, "no address")
    fd = os.open(f"/proc/{pid}/mem", os.O_RDONLY | os.O_CLOEXEC)
    try:
        return os.pread(fd, min(length, MAX_ADDR), addr)
    finally:
        os.close(fd)


def decide(listener: int, req: Request, rules: Rules) -> tuple[int, str]:
    """Check ``req`` against ``rules`` and, if allowed, connect the worker's socket; returns
    the errno for the worker (0: connected) and, when the gate refused, why. May block in
    ``connect`` (a blocking socket whose listener's backlog is full): call it off the event
    loop."""
    try:
        data = _read_address(req.pid, req.addr, req.length)
        if not _valid(listener, req):  # the pid may be another process's by now
            return errno.ENOENT, ""
        sock = _take_socket(req.pid, req.fd)
    except OSError as exc:
        return exc.errno or errno.EACCES, f"cannot read the call: {exc.strerror or exc}"
    with sock:
        if not _valid(listener, req):
            return errno.ENOENT, ""
        try:
            target = _target(sock, req.pid, data, rules)
        except AbstractRefused:  # what Landlock's scoping answers too; X clients try it first
            return errno.ECONNREFUSED, ""
        except OSError as exc:
            return exc.errno or errno.EACCES, str(exc.strerror or exc)
        try:
            if isinstance(target, str):
                return _connect_path(sock, target, rules)
            return sock.connect_ex(target), ""
        except OSError as exc:  # an address Python cannot express
            return exc.errno or errno.EINVAL, ""


def _connect_path(sock: socket.socket, resolved: str, rules: Rules) -> tuple[int, str]:
    """Connect ``sock`` to the socket file at ``resolved`` (checked, free of links when it was
    resolved), opening every component without following a link: a component the worker
    swapped for a link since (in a folder it may write) fails instead of leading elsewhere.
    The socket file opened must not be one of the never-granted sockets under another name
    (:meth:`Rules.guarded`). The connect goes through ``/proc/self/fd`` to that file. Returns
    the errno and, when refused, why."""
    parts = [p for p in resolved.split("/") if p]
    if not parts:
        return errno.ECONNREFUSED, ""
    fd = os.open("/", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in parts[:-1]:
            nxt = os.open(
                part, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd
            )
            os.close(fd)
            fd = nxt
        last = os.open(parts[-1], os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
    except OSError as exc:
        os.close(fd)
        return (errno.ENOENT if exc.errno == errno.ENOENT else errno.EACCES), ""
    os.close(fd)
    try:
        st = os.fstat(last)
        if not stat.S_ISSOCK(st.st_mode):
            return errno.ECONNREFUSED, ""  # what connecting a file that is not a socket answers
        if (st.st_dev, st.st_ino) in rules.guarded():
            return errno.EACCES, f"{resolved}: another name of a never-granted socket"
        return sock.connect_ex(f"/proc/self/fd/{last}"), ""
    finally:
        os.close(last)


def _target(sock: socket.socket, pid: int, data: bytes, rules: Rules):  # type: ignore[no-untyped-def]
    """The address to connect ``sock`` to, as checked (raises with the errno to answer)."""
    if len(data) < 2:
        raise OSError(errno.EINVAL, "short address")
    (family,) = struct.unpack_from("=H", data)
    domain = sock.family
    if domain == socket.AF_UNIX:
        if family != socket.AF_UNIX:
            raise OSError(errno.EINVAL, "not a Unix address")
        raw = data[2:]
        if not raw or raw[0] == 0:  # abstract, or unnamed
            raise AbstractRefused(errno.ECONNREFUSED, "abstract Unix sockets are refused")
        path = os.fsdecode(raw.split(b"\0", 1)[0])
        if not os.path.isabs(path):
            path = os.path.join(f"/proc/{pid}/cwd", path)
        resolved = os.path.realpath(path)
        if resolved.startswith(f"/proc/{pid}/"):  # its cwd is gone or not ours to see
            raise OSError(errno.EACCES, "unresolvable path")
        if never_hit(resolved, rules.never) is not None:
            raise OSError(errno.EACCES, f"{resolved}: the host's own, never granted")
        if not rules.allows_path(resolved):
            raise OSError(errno.EACCES, f"{resolved}: not granted (confine.unix)")
        return resolved  # opened without following a link by decide: _connect_path
    if domain in (socket.AF_INET, socket.AF_INET6) and family == domain:
        if domain == socket.AF_INET:
            port, ip = struct.unpack_from("!H4s", data, 2)
            host = socket.inet_ntop(socket.AF_INET, ip)
            target: tuple[str, int] | tuple[str, int, int, int] = (host, port)
        else:
            if len(data) < 28:
                raise OSError(errno.EINVAL, "short address")
            port, flow, ip, scope = struct.unpack_from("!HI16sI", data, 2)
            target = (socket.inet_ntop(socket.AF_INET6, ip), port, flow, socket.ntohl(scope))
        if (
            rules.tcp_ports is not None
            and sock.type == socket.SOCK_STREAM
            and port not in rules.tcp_ports
        ):
            raise OSError(errno.EACCES, f"TCP port {port} not granted")
        return target
    raise OSError(errno.EAFNOSUPPORT, "address family not supported by the gate")


@functools.cache
def available() -> str:
    """Why the gate cannot work on this kernel ("": it can): it needs seccomp user
    notifications (Linux 5.0), ``pidfd_getfd`` (5.6) and ``os.pidfd_open``."""
    if not hasattr(os, "pidfd_open"):
        return "os.pidfd_open is missing"
    try:
        pidfd = os.pidfd_open(os.getpid())
    except OSError as exc:
        return f"pidfd_open: {exc.strerror}"
    try:
        fd = int(_syscall()(PIDFD_GETFD, pidfd, 0, 0))
        if fd < 0:
            return f"pidfd_getfd: {os.strerror(ctypes.get_errno())}"
        os.close(fd)
    finally:
        os.close(pidfd)
    return ""
