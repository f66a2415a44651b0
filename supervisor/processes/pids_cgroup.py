"""A pids cgroup per worker: the process limit that also binds root.

# Strategy: ``RLIMIT_NPROC`` counts every process of the user and does not bind uid 0 at all
# (the kernel exempts the root user whatever its capabilities), so the limit that works for a
# worker run by root, and for one fork bomb among many workers of one user, is the pids
# controller: ``pids.max`` caps the tasks (processes and threads) of the group, and a worker
# cannot leave it (moving a process needs write access to another group's ``cgroup.procs``,
# which its Landlock rules and dropped capabilities refuse). :meth:`PidsCgroups.probe` finds a
# writable pids hierarchy (cgroup v1 ``/sys/fs/cgroup/pids``, or the host's own v2 group when
# its ``subtree_control`` enables ``pids``, as ``Delegate=yes`` allows); the parent makes one
# group per worker (:meth:`create`), the child writes its own pid into ``cgroup.procs`` before
# anything else, and the reaper empties and removes the group (:meth:`remove`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time

ROOT = "/sys/fs/cgroup"


def _own_path(version: int, mount: str) -> str | None:
    """This process's group path in hierarchy ``version`` (1: the pids controller's)."""
    try:
        with open("/proc/self/cgroup", encoding="ascii") as f:
            lines = f.read().splitlines()
    except (OSError, ValueError):
        return None
    for line in lines:
        num, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if version == 2 and num == "0" and controllers == "":
            return os.path.join(mount, path.lstrip("/"))
        if version == 1 and "pids" in controllers.split(","):
            return os.path.join(mount, path.lstrip("/"))
    return None


class PidsCgroups:
    """Where this host makes its workers' pids groups.

    Args:
        base: The folder under which one group per worker is made (created if missing).
        version: 1 or 2.
    """

    def __init__(self, base: str, version: int) -> None:
        self.base = base
        self.version = version

    @classmethod
    def probe(cls, tag: str | None = None) -> PidsCgroups | None:
        """A writable pids hierarchy for this host, or None (then: ``RLIMIT_NPROC``, which
        does not bind root).

        Args:
            tag: The name of this host's folder of groups (default ``toolhost-<pid>``).
        """
        tag = tag or f"toolhost-{os.getpid()}"
        v1 = os.path.join(ROOT, "pids")
        if os.path.isfile(os.path.join(v1, "cgroup.procs")):
            own = _own_path(1, v1)
            if own and os.access(own, os.W_OK):
                return cls(os.path.join(own, tag), 1)
        for mount in (ROOT, os.path.join(ROOT, "unified")):
            own = _own_path(2, mount)
            if not own or not os.path.isfile(os.path.join(own, "cgroup.controllers")):
                continue
            try:
                with open(os.path.join(own, "cgroup.subtree_control"), encoding="ascii") as f:
                    enabled = f.read().split()
            except OSError:
                continue
            if "pids" in enabled and os.access(own, os.W_OK):
                return cls(os.path.join(own, tag), 2)
        return None

    def create(self, name: str, limit: int) -> str:
        """Make the group ``name`` with ``pids.max`` = ``limit``; returns its folder.

        Raises:
            OSError: It could not be made.
        """
        os.makedirs(self.base, exist_ok=True)
        if self.version == 2:
            with (
                contextlib.suppress(OSError),
                open(os.path.join(self.base, "cgroup.subtree_control"), "w", encoding="ascii") as f,
            ):
                f.write("+pids")
        path = os.path.join(self.base, name)
        os.mkdir(path)
        try:
            with open(os.path.join(path, "pids.max"), "w", encoding="ascii") as f:
                f.write(str(limit))
        except OSError:
            with contextlib.suppress(OSError):
                os.rmdir(path)
            raise
        return path

    @staticmethod
    def set_limit(path: str, limit: int) -> None:
        """Set ``pids.max`` of the group at ``path`` (a spare's group, taken by a worker).

        Raises:
            OSError: It could not be written.
        """
        with open(os.path.join(path, "pids.max"), "w", encoding="ascii") as f:
            f.write(str(limit))

    @staticmethod
    def procs_file(path: str) -> str:
        """The file a child writes its pid to, to join the group at ``path``."""
        return os.path.join(path, "cgroup.procs")

    @staticmethod
    def current(path: str) -> int:
        """Tasks in the group now (0 when it is gone)."""
        try:
            with open(os.path.join(path, "pids.current"), encoding="ascii") as f:
                return int(f.read().strip() or 0)
        except (OSError, ValueError):
            return 0

    @staticmethod
    def remove(path: str) -> bool:
        """Kill whatever is left in the group and remove it; True when it is gone (blocks for
        at most about 50 ms: call it from a thread in async code)."""
        for _ in range(50):
            try:
                os.rmdir(path)
                return True
            except FileNotFoundError:
                return True
            except OSError:
                pass
            try:
                with open(os.path.join(path, "cgroup.procs"), encoding="ascii") as f:
                    pids = [int(p) for p in f.read().split()]
            except (OSError, ValueError):
                pids = []
            for pid in pids:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.001)  # the killed tasks leave the group as they exit
        return False

    def close(self) -> None:
        """Remove this host's folder of groups (once every worker's group is gone)."""
        with contextlib.suppress(OSError):
            os.rmdir(self.base)
