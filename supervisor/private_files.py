"""Files only the host's user may read or trust: the tokens, the vault, the audit log, the quota
and sidecar state.

# Strategy: such a file is opened by its path once, with ``O_NOFOLLOW``: a symlink is refused
# (never followed, never created through: a missing file is created with ``O_CREAT|O_EXCL``,
# which fails on any link, dangling or not). Everything else is checked and fixed on the open
# descriptor (``fstat``: a regular file owned by the host's user; ``fchmod`` to 0600 with a
# warning when others could read it), never on the path, so nothing can be swapped between the
# check and the use. New files are 0600 in a 0700 folder. A file on a read-only filesystem (a
# Kubernetes Secret) cannot be tightened or have been written through it: it is used with a
# warning. Tokens are read once (:class:`TokenFile`, at start and at reload), never per use.
"""

from __future__ import annotations

import errno
import logging
import os
import secrets
import stat

log = logging.getLogger("toolhost.files")

_OPEN = os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK  # NONBLOCK: a FIFO must not hang the open


class NotPrivate(OSError):
    """The file cannot be trusted as private: another user's, not a regular file, a symlink."""


class Symlinked(NotPrivate):
    """The path is a symlink (the host never follows one to a private file)."""


def open_nofollow(
    path: str, flags: int, *, create: bool = True, new_flags: int | None = None
) -> tuple[int, bool]:
    """``os.open`` without following a symlink; returns ``(fd, created)``.

    With ``create`` a missing file is created 0600 (``O_CREAT|O_EXCL``, with ``new_flags`` when
    given; its folder 0700). No check of the file is made here (:func:`make_private` does that).

    Raises:
        Symlinked: ``path`` is a symlink (dangling or not); nothing was created.
        FileNotFoundError: It does not exist (and ``create`` is False).
        OSError: It cannot be opened.
    """
    if create:
        folder = os.path.dirname(path)
        if folder and not os.path.isdir(folder):
            os.makedirs(folder, mode=0o700, exist_ok=True)
    for _ in range(3):
        if create:
            try:
                new = flags if new_flags is None else new_flags
                return os.open(path, new | _OPEN | os.O_CREAT | os.O_EXCL, 0o600), True
            except FileExistsError:
                pass  # a file, or a link: open what is there without following it
        try:
            return os.open(path, flags | _OPEN), False
        except FileNotFoundError:
            if not create:
                raise
            # removed between the two opens: create it
        except OSError as exc:
            if exc.errno == errno.ELOOP and _is_link(path):
                raise Symlinked(f"{path} is a symlink; refusing to follow it") from None
            raise
    raise FileNotFoundError(errno.ENOENT, f"{path} keeps disappearing; cannot open it")


def _is_link(path: str) -> bool:
    try:
        return stat.S_ISLNK(os.lstat(path).st_mode)
    except OSError:
        return False


def _read_only(fd: int) -> bool:
    try:
        return bool(os.fstatvfs(fd).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def make_private(fd: int, path: str, *, tighten: bool = True) -> None:
    """Check an open file: a regular file owned by the host's user, 0600.

    A file others can read or write is set to 0600 with a warning (``tighten``) or refused. On a
    read-only filesystem the owner and mode cannot be fixed: it is used with a warning.

    Raises:
        NotPrivate: Not a regular file, another user's, or (without ``tighten``) open to others.
    """
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        raise NotPrivate(f"{path} is not a regular file; refusing to use it")
    read_only = _read_only(fd)
    uid = os.geteuid()
    if st.st_uid != uid:
        if not read_only:
            raise NotPrivate(
                f"{path} belongs to uid {st.st_uid}, not to the host's user {uid}; "
                "move it away so the host can create a private one",
            )
        log.warning("%s belongs to uid %d (a read-only mount): using it", path, st.st_uid)
    mode = stat.S_IMODE(st.st_mode)
    if not mode & 0o077:
        return
    if read_only:
        log.warning("%s has mode %04o and cannot be tightened (read-only filesystem)", path, mode)
    elif tighten:
        os.fchmod(fd, 0o600)
        log.warning("%s had mode %04o (others could read it); set to 0600", path, mode)
    else:
        raise NotPrivate(
            f"refusing to read {path}: its mode {mode:04o} lets other users read or write it; "
            f"run `chmod 600 {path}` (and check who changed it)",
        )


def open_private(path: str, flags: int, *, create: bool = True) -> int:
    """Open (or create, 0600) a private file without following a symlink, then
    :func:`make_private` it.

    Raises:
        Symlinked: ``path`` is a symlink.
        NotPrivate: The file is another user's or not a regular file (the descriptor is closed).
        OSError: It cannot be opened.
    """
    fd, _ = open_nofollow(path, flags, create=create)
    try:
        make_private(fd, path)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_private(fd: int) -> bytes:
    """The whole content of an open file."""
    chunks = []
    while chunk := os.read(fd, 1 << 16):
        chunks.append(chunk)
    return b"".join(chunks)


def read_token(path: str, *, create: bool = True) -> str:
    """A bearer token file: read (checked as :func:`open_private` does), or, when absent and
    ``create``, generated into a new 0600 file.

    Raises:
        Symlinked, NotPrivate, OSError: As :func:`open_private`.
        ValueError: The file is empty.
    """
    # An existing token is opened read-only: a read-only mount (a Kubernetes Secret) is fine.
    fd, created = open_nofollow(path, os.O_RDONLY, create=create, new_flags=os.O_WRONLY)
    try:
        if created:
            token = secrets.token_urlsafe(32)
            os.write(fd, (token + "\n").encode())
            return token
        make_private(fd, path)
        token = read_private(fd).decode("utf-8", "replace").strip()
    finally:
        os.close(fd)
    if not token:
        raise ValueError(f"{path} is empty; delete it to have a new token generated")
    return token


class TokenFile:
    """A token read when :meth:`load` is called (at start and at reload), never per use: a file
    rewritten under the host changes nothing until the operator reloads.

    Args:
        path: The token file.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self.value = ""

    def load(self) -> bool:
        """(Re-)read the file; True when it held a different token than the last read.

        Raises:
            OSError, ValueError: As :func:`read_token` (the token read before is kept).
        """
        token = read_token(self.path)
        changed = bool(self.value) and token != self.value
        self.value = token
        return changed
