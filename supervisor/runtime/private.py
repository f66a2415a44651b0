"""Files only the host's user may read: the audit log, the quota state (and later the vault).

# Strategy: create with mode 0600 (inside a 0700 folder); an existing file that others can read
# or write is tightened to 0600 on open, with a warning, because its contents (who called which
# tool, when) are the operator's business only. A file owned by another user is refused: the
# host cannot make it private, so it says so instead of writing into it.
"""

from __future__ import annotations

import logging
import os
import stat

log = logging.getLogger("toolhost.files")


class NotPrivate(OSError):
    """The file belongs to another user; it cannot be made private."""


def open_private(path: str, flags: int) -> int:
    """``os.open(path, flags | O_CREAT, 0o600)``, then make sure the file is 0600 and ours.

    Raises:
        NotPrivate: The file is owned by another user (the descriptor is closed).
        OSError: It cannot be opened.
    """
    folder = os.path.dirname(path)
    if folder and not os.path.isdir(folder):
        os.makedirs(folder, mode=0o700, exist_ok=True)
    fd = os.open(path, flags | os.O_CREAT, 0o600)
    try:
        make_private(fd, path)
    except BaseException:
        os.close(fd)
        raise
    return fd


def make_private(fd: int, path: str) -> None:
    """Tighten an open file to 0600 (warning when it was not); refuse another user's file."""
    st = os.fstat(fd)
    if st.st_uid != os.getuid():
        raise NotPrivate(
            f"{path} belongs to uid {st.st_uid}, not to the host's user {os.getuid()}; "
            "move it away so the host can create a private one"
        )
    mode = stat.S_IMODE(st.st_mode)
    if mode & 0o077:
        log.warning("%s had mode %04o (others could read it); set to 0600", path, mode)
        os.fchmod(fd, 0o600)
