"""Durable file-system steps for the package manager: atomic writes, renames, a lock.

# Strategy: every change the manager makes is one of three durable steps. ``atomic_write``
# writes a temp file next to the target, fsyncs it, renames it over the target and fsyncs the
# folder; ``durable_rename`` renames and fsyncs both folders; ``copy_tree`` copies a package and
# fsyncs every file and folder it made. A rename is atomic on POSIX within one file system, so a
# crash leaves either the old or the new name, never a half-written file.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import stat
from pathlib import Path

# Folders left out of copies and checksums: byte-code caches an interpreter writes at will.
IGNORED_DIRS = frozenset(("__pycache__",))


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """Make a folder's entries (created, renamed, removed names) durable."""
    fd = os.open(os.fspath(path), os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: str | os.PathLike[str], data: bytes, *, mode: int = 0o644) -> None:
    """Replace ``path`` with ``data`` atomically and durably (temp file, fsync, rename)."""
    target = Path(path)
    tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fsync_dir(target.parent)


def durable_rename(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
    """Rename ``src`` to ``dst`` (creating ``dst``'s folder) and make both folders durable."""
    s, d = Path(src), Path(dst)
    make_dirs(d.parent)
    os.rename(s, d)
    fsync_dir(d.parent)
    if s.parent != d.parent:
        fsync_dir(s.parent)


def make_dirs(path: str | os.PathLike[str]) -> None:
    """``mkdir -p`` that fsyncs each parent of a folder it created."""
    p = Path(path)
    if p.is_dir():
        return
    make_dirs(p.parent)
    with contextlib.suppress(FileExistsError):
        p.mkdir()
    fsync_dir(p.parent)


def remove_tree(path: str | os.PathLike[str]) -> None:
    """Remove a folder (or file, or link) if present; durable for its parent."""
    p = Path(path)
    if p.is_symlink() or p.is_file():
        p.unlink()
    elif p.is_dir():
        shutil.rmtree(p)
    else:
        return
    fsync_dir(p.parent)


def _fsync_file(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def copy_tree(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
    """Copy a package folder: files (with modes), folders and in-package symlinks, durably.

    ``dst`` must not exist. Byte-code cache folders are skipped.
    """
    s, d = os.fspath(src), os.fspath(dst)
    os.mkdir(d, 0o755)
    for entry in sorted(os.scandir(s), key=lambda e: e.name):
        if entry.name in IGNORED_DIRS:
            continue
        target = os.path.join(d, entry.name)
        if entry.is_symlink():
            os.symlink(os.readlink(entry.path), target)
        elif entry.is_dir(follow_symlinks=False):
            copy_tree(entry.path, target)
        elif entry.is_file(follow_symlinks=False):
            shutil.copyfile(entry.path, target, follow_symlinks=False)
            os.chmod(target, stat.S_IMODE(entry.stat(follow_symlinks=False).st_mode) & 0o755)
            _fsync_file(target)
    fsync_dir(d)


class LockBusy(Exception):
    """Another process holds the package lock."""


class FileLock:
    """An exclusive ``flock`` on one file; released by the kernel if the holder dies.

    The holder's pid is written into the file so a refusal can say who holds it, followed by
    ``role`` when one is given (what the holder is: ``serve``).
    """

    def __init__(self, path: str | os.PathLike[str], role: str = "") -> None:
        self.path = Path(path)
        self.role = role
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def try_acquire(self) -> bool:
        """Take the lock if it is free; True on success (also when already held here)."""
        if self._fd is not None:
            return True
        make_dirs(self.path.parent)
        # Never through a symlink: the holder truncates the file it locks.
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        except BaseException:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()} {self.role}".strip().encode() + b"\n")
        self._fd = fd
        return True

    def holder(self) -> str:
        """The pid written by the current holder, or ``"?"``."""
        return self._written()[0] or "?"

    def holder_role(self) -> str:
        """The role the current holder wrote ("" when none, or written by an older version)."""
        return self._written()[1]

    def _written(self) -> tuple[str, str]:
        try:
            pid, _, role = self.path.read_text().strip().partition(" ")
        except OSError:
            return "", ""
        return pid, role.strip()

    def acquire(self) -> None:
        """Take the lock or raise :class:`LockBusy` naming the holder."""
        if not self.try_acquire():
            raise LockBusy(
                f"another package operation is in progress (pid {self.holder()} holds "
                f"{self.path.name})"
            )

    def release(self) -> None:
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
        os.close(fd)  # closing the descriptor drops the flock

    def __enter__(self) -> FileLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
