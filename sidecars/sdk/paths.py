"""Confine user-supplied paths to the project directory, and write outputs atomically.

Every file a sidecar tool reads or writes on a model's behalf must stay under ``projectDir``
(``ctx.project_dir``). :func:`confine` turns a user path into an absolute, symlink-resolved
:class:`pathlib.Path` or raises :class:`~sidecars.sdk.ToolError`.

Rules, checked in this order (the first failing rule wins):

====================  =================  =====================================================
reason                code               when
====================  =================  =====================================================
``empty-path``        ``invalid-input``  the path is empty or only whitespace
``nul-byte``          ``invalid-input``  the path contains a NUL character
``absolute-path``     ``invalid-input``  rooted (``/x``, ``\\x``) or with a Windows drive
                                         (``C:x``, ``C:\\x``); ``~`` is an ordinary name
``parent-traversal``  ``invalid-input``  any ``..`` component, even one that would stay inside
                                         (``/`` and ``\\`` both count as separators here)
``symlink-escape``    ``invalid-input``  the real path (every symlink followed, including the
                                         final component and dangling links) leaves projectDir
``host-private``      ``invalid-input``  the path, as written or resolved, is one of the host's
                                         own files (PROTOCOL 1): ``.toolhost/``, ``tools/``,
                                         registry and manifest files, the host's installation
``not-found``         ``failed``         ``must_exist`` and nothing is there
``inaccessible``      ``failed``         ``stat`` fails otherwise (symlink loop, permissions)
``not-a-file``        ``invalid-input``  ``kind="file"`` but the path is a directory or special
``not-a-directory``   ``invalid-input``  ``kind="dir"`` but the path is not a directory
====================  =================  =====================================================

``not-found`` and ``inaccessible`` are the only rejections with code ``failed``: the request
was well formed and the capability works, the file just is not there (or cannot be reached).
Every other rule rejects the request itself, so it is ``invalid-input``. Each error's message
names the offending path and its ``details`` are exactly
``{"path": <the user path as given>, "reason": <one of the codes above>}``.

The host-private list comes from the host (``hostPrivate`` in ``init`` and in a oneshot request)
through :func:`set_host_private`; the SDK's own installation is always on it. Tools that walk a
folder (``archive.create``) or write members below one (``archive.extract``) check every entry
with :func:`host_private`.

The checks are made once, before the tool touches the file; a concurrent process that swaps a
directory for a symlink afterwards is outside this module's threat model.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Literal

from sidecars.sdk.private import host_private as host_private
from sidecars.sdk.private import set_host_private as set_host_private
from sidecars.sdk.tools import ToolError

PathKind = Literal["file", "dir", "any"]


def _read_umask() -> int:
    # Read once at import, while the process is still single-threaded: os.umask can only be
    # read by setting it.
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


_UMASK = _read_umask()


def private_reject(user_path: str, label: str = "path") -> ToolError:
    """The refusal for a host-private path (reason ``host-private``)."""
    return reject(
        user_path,
        "host-private",
        f"{label} {user_path!r} is one of the host's own files (its state, registry, sidecar code "
        "or installation); no tool may read or write it",
    )


def reject(user_path: str, reason: str, message: str, *, code: str = "invalid-input") -> ToolError:
    """Build the :class:`ToolError` for a refused path.

    Args:
        user_path: The path exactly as the caller gave it.
        reason: A stable machine code such as ``parent-traversal``.
        message: Human text; it should name the path.
        code: The result code (``invalid-input`` unless the path is merely missing).

    Returns:
        The error, ready to be raised.
    """
    return ToolError(message, code=code, details={"path": user_path, "reason": reason})


def confine(
    project_dir: str | os.PathLike[str],
    user_path: str,
    *,
    must_exist: bool = True,
    kind: PathKind = "any",
    label: str = "path",
    own_state: bool = False,
) -> Path:
    """Resolve ``user_path`` inside ``project_dir`` or refuse it.

    Args:
        project_dir: The absolute project directory (a relative one is taken from the cwd).
        user_path: A relative path from the caller; ``"."`` names the project directory.
        must_exist: Refuse with ``not-found`` when nothing exists at the path.
        kind: ``"file"`` or ``"dir"`` to require that type when something exists there.
        label: How the message names the argument (``"source"``, ``"output"``...).
        own_state: The path is the sidecar's own state folder, fixed in its code (never a
            caller's path): the host-private rule is not applied.

    Returns:
        The absolute path with every symlink resolved; guaranteed to be the project
        directory or below it at the time of the call.

    Raises:
        ToolError: With ``details={"path": user_path, "reason": ...}`` (see module docs).
    """
    shown = f"{label} {user_path!r}"
    if not user_path.strip():
        raise reject(
            user_path, "empty-path", f"{shown} is empty; give a path relative to the project"
        )
    if "\x00" in user_path:
        raise reject(user_path, "nul-byte", f"{shown} contains a NUL byte")
    if (
        PurePosixPath(user_path).is_absolute()
        or user_path.startswith("\\")
        or PureWindowsPath(user_path).drive
    ):
        raise reject(
            user_path, "absolute-path", f"{shown} is absolute; give a path relative to the project"
        )
    if ".." in user_path.replace("\\", "/").split("/"):
        raise reject(user_path, "parent-traversal", f"{shown} contains a '..' component")
    root = Path(os.path.realpath(project_dir))
    real = Path(os.path.realpath(root / user_path))
    if not real.is_relative_to(root):
        raise reject(
            user_path,
            "symlink-escape",
            f"{shown} resolves through a symlink to outside the project",
        )
    if not own_state and (host_private(real) or host_private(Path(project_dir, user_path))):
        raise private_reject(user_path, label)
    try:
        st = real.stat()
    except FileNotFoundError:
        if must_exist:
            raise reject(user_path, "not-found", f"{shown} does not exist", code="failed") from None
        return real
    except OSError as exc:  # a symlink loop, a permission problem on a parent...
        raise reject(
            user_path, "inaccessible", f"{shown} cannot be examined: {exc.strerror}", code="failed"
        ) from None
    is_dir = os.path.isdir(real)
    if kind == "file" and (is_dir or not stat.S_ISREG(st.st_mode)):
        what = "a directory" if is_dir else "not a regular file"
        raise reject(user_path, "not-a-file", f"{shown} is {what}; a regular file is needed")
    if kind == "dir" and not is_dir:
        raise reject(user_path, "not-a-directory", f"{shown} is not a directory")
    return real


def project_relative(project_dir: str | os.PathLike[str], path: Path) -> str:
    """The POSIX-style path of ``path`` relative to the real project directory (``"."`` for it).

    Args:
        project_dir: The project directory.
        path: A path returned by :func:`confine`.

    Returns:
        A relative path suitable for showing to the caller.
    """
    rel = path.relative_to(os.path.realpath(project_dir))
    return rel.as_posix() if rel.parts else "."


def create_parents(path: Path) -> list[Path]:
    """Create the missing parent directories of ``path``.

    Call it only with a path :func:`confine` accepted: components that do not exist yet cannot
    be symlinks, so the new directories are inside the project too.

    Args:
        path: The file or directory about to be created.

    Returns:
        The directories created, outermost first, so :func:`remove_created` can undo them.
    """
    missing: list[Path] = []
    parent = path.parent
    while not parent.exists():
        missing.append(parent)
        parent = parent.parent
    created: list[Path] = []
    for directory in reversed(missing):
        try:
            directory.mkdir()
        except FileExistsError:
            continue  # raced with another call; it is not ours to remove
        created.append(directory)
    return created


def remove_created(created: list[Path]) -> None:
    """Remove directories made by :func:`create_parents`, innermost first, if still empty.

    Args:
        created: The list :func:`create_parents` returned.
    """
    for directory in reversed(created):
        with contextlib.suppress(OSError):
            directory.rmdir()


@contextlib.contextmanager
def atomic_output(target: Path, *, suffix: str = ".part") -> Iterator[Path]:
    """Yield a temporary path beside ``target``; on success rename it over ``target``.

    The temporary file is created in the target's directory (so the final rename is atomic and
    stays on one file system) with the permissions a plain ``open()`` would give. If the body
    raises, the temporary file is removed and ``target`` is untouched. Missing parent
    directories are created, and removed again on failure.

    Args:
        target: The confined output path.
        suffix: Suffix of the temporary name (handy for libraries that look at suffixes).

    Yields:
        The temporary path to write.
    """
    created = create_parents(target)
    try:
        fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=suffix, dir=target.parent)
    except BaseException:
        remove_created(created)
        raise
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        os.chmod(tmp, 0o666 & ~_UMASK)
        yield tmp
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        remove_created(created)
        raise
