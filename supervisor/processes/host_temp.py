"""The host's temp folder: where its confined workers' private ``TMPDIR`` s live.

# Strategy: every confined sidecar gets a temp folder and each of its workers a private 0700
# ``TMPDIR`` below it (:class:`supervisor.processes.confine.SidecarWalls`). A host that stops
# removes them; one killed with SIGKILL cannot. So they all live in one folder per host,
# ``<tmp>/toolhost-<pid>-<random>``, which the host holds an ``flock`` on for as long as it
# runs, and the next host to start removes the folders of hosts that are gone: a folder is a
# dead host's when its lock can be taken (the kernel drops a lock with its last holder, even
# after SIGKILL, and a lock holds across pid namespaces sharing a ``/tmp``, where a pid would
# not tell). The folder is made under a dot name and renamed into place once locked, so no
# sweep ever sees a live host's folder unlocked. Only this user's folders are touched, and a
# symlink is never followed.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import tempfile

PREFIX = "toolhost-"
LOCK = ".lock"


def _is_host_folder(name: str) -> bool:
    """``toolhost-<pid>-<random>``: a host's temp folder (not a sidecar's, which is inside)."""
    if not name.startswith(PREFIX):
        return False
    pid, sep, rest = name[len(PREFIX) :].partition("-")
    return pid.isdigit() and bool(sep) and bool(rest)


class HostTemp:
    """This host's temp folder, locked while the host runs.

    Args:
        root: Where it is made (default the system's temp folder: ``TMPDIR``).

    Raises:
        OSError: It could not be made or locked.
    """

    def __init__(self, root: str | None = None) -> None:
        self.root = root or tempfile.gettempdir()
        staging = tempfile.mkdtemp(prefix=f".{PREFIX}{os.getpid()}-", dir=self.root)
        try:
            self._lock = os.open(
                os.path.join(staging, LOCK), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600
            )
            try:
                fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                self.path = os.path.join(self.root, os.path.basename(staging)[1:])
                os.rename(staging, self.path)
            except OSError:
                os.close(self._lock)
                raise
        except OSError:
            shutil.rmtree(staging, ignore_errors=True)
            raise

    def sweep(self) -> list[str]:
        """Remove the temp folders of hosts that are gone (their lock is free); returns them."""
        removed: list[str] = []
        try:
            names = os.listdir(self.root)
        except OSError:
            return removed
        uid = os.geteuid()
        for name in names:
            folder = os.path.join(self.root, name)
            if not _is_host_folder(name) or folder == self.path:
                continue
            try:
                st = os.lstat(folder)
                if not os.path.isdir(folder) or os.path.islink(folder) or st.st_uid != uid:
                    continue
                fd = os.open(os.path.join(folder, LOCK), os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
            except OSError:
                continue  # no lock file: not one of ours
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)
                continue  # its host runs
            try:
                shutil.rmtree(folder, ignore_errors=True)
            finally:
                os.close(fd)
            if not os.path.lexists(folder):
                removed.append(folder)
        return removed

    def close(self) -> None:
        """Remove the folder and what is left in it, then drop the lock (the host stops)."""
        if self._lock < 0:
            return
        shutil.rmtree(self.path, ignore_errors=True)
        with contextlib.suppress(OSError):
            os.close(self._lock)
        self._lock = -1
