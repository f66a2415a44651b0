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
# anything else, and the reaper empties and removes the group (:meth:`remove`). A profile with
# ``confine.keep`` (``sidecar``/``host``) has the reaper move what is left into the sidecar's
# kept group instead (:class:`KeptGroups`): only the host can write ``cgroup.procs``, so a
# sidecar cannot leave processes behind unless its profile grants it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import time
from collections.abc import Callable

ROOT = "/sys/fs/cgroup"
TAG = "toolhost-"
"""A host's folder of groups is ``toolhost-<its pid>``."""
KEPT_PREFIX = "kept@"
"""Kept groups are ``<base>/kept@<sidecar>`` (worker groups never hold an ``@``)."""

log = logging.getLogger("toolhost.confine")


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


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


def _listdir(path: str) -> list[str]:
    try:
        return [e.name for e in os.scandir(path) if e.is_dir(follow_symlinks=False)]
    except OSError:
        return []


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
        tag = tag or f"{TAG}{os.getpid()}"
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

    def sweep(self) -> int:
        """Remove the empty groups of processes that are gone (``toolhost-<pid>`` next to this
        host's folder, or ``toolhost-<label>-<pid>``, which tests and benches name theirs by,
        ``<pid>`` dead): a host killed before its cleanup, a ``keep: host`` group whose
        processes ended since, a test run that stopped midway. Kills nothing (a group still
        holding processes cannot be removed); returns how many folders went."""
        parent = os.path.dirname(self.base)
        removed = 0
        try:
            names = os.listdir(parent)
        except OSError:
            return 0
        for name in names:
            folder = os.path.join(parent, name)
            pid = name[len(TAG) :].rpartition("-")[2]
            if not name.startswith(TAG) or not pid.isdigit() or folder == self.base:
                continue
            if _alive(int(pid)):
                continue
            for group in _listdir(folder):
                with contextlib.suppress(OSError):
                    os.rmdir(os.path.join(folder, group))
            with contextlib.suppress(OSError):
                os.rmdir(folder)
                removed += 1
        return removed

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

    @staticmethod
    def procs(path: str) -> list[int]:
        """The processes in the group at ``path`` (empty when it is gone)."""
        try:
            with open(os.path.join(path, "cgroup.procs"), encoding="ascii") as f:
                return [int(p) for p in f.read().split()]
        except (OSError, ValueError):
            return []

    @staticmethod
    def move(src: str, dst: str) -> int:
        """Move every process of group ``src`` into group ``dst`` and remove ``src``; returns
        how many moved (blocks for at most about 50 ms).

        Raises:
            OSError: ``src`` could not be emptied (what is left is for :meth:`remove`).
        """
        moved = 0
        target = os.path.join(dst, "cgroup.procs")
        for _ in range(50):
            pids = PidsCgroups.procs(src)
            for pid in pids:
                try:
                    with open(target, "w", encoding="ascii") as f:
                        f.write(str(pid))
                    moved += 1
                except ProcessLookupError:
                    pass
            try:
                os.rmdir(src)
                return moved
            except FileNotFoundError:
                return moved
            except OSError:
                if not pids:
                    time.sleep(0.001)  # exiting tasks leave the group as they are reaped
        raise OSError(f"pids group {src} could not be emptied into {dst}")

    def close(self) -> None:
        """Remove this host's folder of groups (once every worker's group is gone)."""
        with contextlib.suppress(OSError):
            os.rmdir(self.base)


class KeptGroups:
    """Each sidecar's kept pids group: where a worker's leftover processes go when it ends and
    its profile has ``confine.keep`` ``sidecar`` or ``host`` (docs/confinement.md).

    The group has the profile's ``processes`` limit, and nothing is moved that would not fit
    (the worker's group is killed instead): a sidecar restarted in a loop cannot pile
    processes up. The host empties a sidecar's group when the sidecar leaves the registry or
    its profile stops granting ``keep`` (:meth:`release`), and every group but the ``host``
    ones when it stops (:meth:`close`).
    """

    def __init__(self, cgroups: PidsCgroups) -> None:
        self.cgroups = cgroups
        self._groups: dict[str, tuple[str, str]] = {}
        self._held: dict[str, list[Callable[[], None]]] = {}
        self._closed = False

    def path(self, sidecar: str) -> str:
        """The folder of ``sidecar``'s kept group (made or not)."""
        safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in sidecar)
        return os.path.join(self.cgroups.base, KEPT_PREFIX + safe)

    def sidecars(self) -> list[str]:
        """Sidecars that have a kept group now."""
        return list(self._groups)

    def keep(self, sidecar: str, scope: str, limit: int, group: str) -> int:
        """The worker whose pids group is ``group`` ended: move what is left in it to
        ``sidecar``'s kept group (made with ``pids.max`` = ``limit``), or kill it when that
        would pass the limit or the host is stopping; returns how many processes were kept.
        Blocks for at most about 100 ms (the callers already block as long to remove a group).
        """
        left = PidsCgroups.current(group)
        if left == 0 or self._closed:
            PidsCgroups.remove(group)
            return 0
        path = self.path(sidecar)
        try:
            if not os.path.isdir(path):
                path = self.cgroups.create(os.path.basename(path), limit)
            else:
                with open(os.path.join(path, "pids.max"), "w", encoding="ascii") as f:
                    f.write(str(limit))
        except OSError as exc:
            log.warning(
                "sidecar %s: no kept pids group (%s): its worker's processes die", sidecar, exc
            )
            PidsCgroups.remove(group)
            return 0
        self._groups[sidecar] = (path, scope)
        now = PidsCgroups.current(path)
        if now == 0:  # every process kept before is gone: so is the need for what it held
            self._undo_held(sidecar)
        if now + left > limit:
            log.warning(
                "sidecar %s: %d processes left by its worker would pass its kept group's limit"
                " (confine.processes %d): killed",
                sidecar,
                left,
                limit,
            )
            PidsCgroups.remove(group)
            return 0
        try:
            return PidsCgroups.move(group, path)
        except OSError as exc:
            log.warning("sidecar %s: %s: killed", sidecar, exc)
            PidsCgroups.remove(group)
            return 0

    def hold(self, sidecar: str, undo: Callable[[], None]) -> None:
        """What was issued to a worker whose processes were just kept (its egress proxy token,
        which they inherited in their environment) stays valid while they may run: ``undo``
        runs when ``sidecar``'s kept group goes (:meth:`release`, :meth:`close`) or is found
        empty by the next :meth:`keep`."""
        self._held.setdefault(sidecar, []).append(undo)

    def _undo_held(self, sidecar: str) -> None:
        for undo in self._held.pop(sidecar, []):
            with contextlib.suppress(Exception):  # the host's own bookkeeping: never fatal
                undo()

    def release(self, sidecar: str) -> None:
        """Kill ``sidecar``'s kept processes and remove its group."""
        got = self._groups.pop(sidecar, None)
        if got is not None:
            PidsCgroups.remove(got[0])
        self._undo_held(sidecar)

    def close(self) -> list[str]:
        """The host stops: kill every kept group but those of ``keep: host`` sidecars, which
        are left running (still limited); returns the groups left. Later workers' leftovers
        are killed."""
        self._closed = True
        left = []
        for path, scope in list(self._groups.values()):
            if scope == "host" and PidsCgroups.current(path) > 0:
                left.append(path)
            else:
                PidsCgroups.remove(path)
        self._groups = {}
        for sidecar in list(self._held):  # the host's proxy stops with it anyway
            self._undo_held(sidecar)
        return left
