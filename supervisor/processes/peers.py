"""Is a socket peer one of this host's confined sidecar processes? (PROTOCOL 7: never the kernel
socket.)

# Strategy: Landlock (up to ABI 7) does not control ``connect`` on a pathname Unix socket, so a
# sidecar whose profile grants ``unix`` (the computer family's X server socket) could name the
# kernel socket and call any tool past every gate. The socket's accept path asks
# :meth:`PeerGuard.refusal` about the peer's pid (``SO_PEERCRED``): a process is refused when it
# sits in one of this host's worker pids groups, or when it descends from the host and carries
# walls the host does not (its own network namespace, ``no_new_privs`` the host lacks, more
# seccomp filters than the host has). The host is a child subreaper while it runs workers, so a
# sidecar's orphans stay its descendants; the pids group survives re-parenting anyway. Clients
# that are not the host's descendants (the kernel, the CLI, a container sharing the socket) are
# never judged by their walls: a kernel run under systemd's ``NoNewPrivileges=`` stays welcome.
# Standard library only; a few small ``/proc`` reads per accepted connection, none per call.
"""

from __future__ import annotations

import os


def _status(pid: int | str) -> dict[str, str]:
    try:
        with open(f"/proc/{pid}/status", encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError:
        return {}
    out: dict[str, str] = {}
    for line in text.splitlines():
        name, sep, value = line.partition(":")
        if sep:
            out[name] = value.strip()
    return out


def _netns(pid: int | str) -> int | None:
    try:
        return os.stat(f"/proc/{pid}/ns/net").st_ino
    except OSError:
        return None


def _int(value: str | None) -> int:
    try:
        return int(value or "0")
    except ValueError:
        return 0


def _parent(pid: int) -> int:
    status = _status(pid)
    return _int(status.get("PPid"))


class PeerGuard:
    """Judges socket peers for one host process.

    Args:
        host_pid: The host's pid (default: this process).
        cgroup_tag: The name of the host's folder of worker pids groups (``toolhost-<pid>``;
            empty: none, then only the walls are judged).
    """

    MAX_DEPTH = 64

    def __init__(self, host_pid: int | None = None, cgroup_tag: str = "") -> None:
        self.host_pid = host_pid if host_pid is not None else os.getpid()
        self.cgroup_tag = cgroup_tag
        own = _status(self.host_pid)
        self._nnp = _int(own.get("NoNewPrivs"))
        self._filters = _int(own.get("Seccomp_filters"))
        self._seccomp = _int(own.get("Seccomp"))
        self._netns = _netns(self.host_pid)

    def _in_worker_group(self, pid: int) -> bool:
        if not self.cgroup_tag:
            return False
        try:
            with open(f"/proc/{pid}/cgroup", encoding="utf-8", errors="replace") as f:
                lines = f.read().splitlines()
        except OSError:
            return False
        for line in lines:
            path = line.split(":", 2)[-1]
            if self.cgroup_tag in path.split("/"):
                return True
        return False

    def _descends(self, pid: int) -> bool:
        seen = 0
        while pid > 1 and seen < self.MAX_DEPTH:
            pid = _parent(pid)
            if pid == self.host_pid:
                return True
            seen += 1
        return False

    def _walled(self, pid: int) -> str:
        status = _status(pid)
        if not status:
            return ""
        netns = _netns(pid)
        if netns is not None and self._netns is not None and netns != self._netns:
            return "it runs in a network namespace of its own"
        if _int(status.get("NoNewPrivs")) > self._nnp:
            return "it runs with no_new_privs the host does not have"
        if _int(status.get("Seccomp")) > self._seccomp or (
            _int(status.get("Seccomp_filters")) > self._filters
        ):
            return "it runs under a seccomp filter the host does not have"
        return ""

    def refusal(self, pid: int) -> str:
        """Why peer ``pid`` is a confined sidecar process the socket must refuse ("" if not).

        Args:
            pid: The peer's pid (``SO_PEERCRED``; 0 or negative: unknown, never refused).
        """
        if pid <= 0 or pid == self.host_pid:
            return ""
        if self._in_worker_group(pid):
            return f"process {pid} is in a sidecar worker's pids group"
        if not self._descends(pid):
            return ""
        why = self._walled(pid)
        return f"process {pid} is a confined sidecar process: {why}" if why else ""
