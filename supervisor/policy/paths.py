"""Command resolution per PROTOCOL 1: portable commands only.

- an absolute command is ``outside-root-denied``;
- a relative command (``./bin/x``, ``tools/packages/x/run``) resolves against its cwd anchor and
  must stay inside it, symlinks included;
- a bare name is looked up on PATH; ``python`` and ``python3`` mean the host's interpreter.

File-system access is injected (``which``, ``realpath``, ``is_executable``) so the rules are
table-testable without touching the disk.
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Callable

from msgspec import Struct

from supervisor.contracts.snapshot import PathDetails, PathState

HOST_PYTHON_NAMES = frozenset(("python", "python3"))


def host_path(path_env: str | None, executable: str) -> str:
    """The PATH the host resolves bare names with and hands to sidecars: the folder of its own
    interpreter first (a virtual environment's ``bin``, whatever shell started the host), then
    ``path_env`` (``os.defpath`` when unset) without that folder again.

    ``executable`` is ``sys.executable`` as started, not resolved through symlinks: a venv's
    ``python`` is a symlink to the base interpreter, whose folder is not the venv's ``bin``.
    """
    first = os.path.dirname(os.path.abspath(executable)) if executable else ""
    source = os.defpath if path_env is None else path_env
    rest = source.split(os.pathsep) if source else []
    if not first:
        return os.pathsep.join(rest)
    return os.pathsep.join([first, *(p for p in rest if os.path.normpath(p or ".") != first)])


class Resolution(Struct, frozen=True, kw_only=True):
    """Outcome of resolving a sidecar command."""

    state: PathState
    details: PathDetails
    executable: str | None = None
    message: str = ""


def is_inside(root: str, path: str) -> bool:
    """True when normalised absolute ``path`` is ``root`` or below it."""
    root = posixpath.normpath(root)
    path = posixpath.normpath(path)
    return path == root or path.startswith(root.rstrip("/") + "/")


def resolve_command(
    command: str,
    *,
    anchor_name: str,
    anchor_dir: str,
    path_env: str,
    host_python: str,
    which: Callable[[str, str], str | None],
    realpath: Callable[[str], str] = os.path.realpath,
    is_executable: Callable[[str], bool] = lambda p: os.path.isfile(p) and os.access(p, os.X_OK),
) -> Resolution:
    """Resolve ``command`` for spawning.

    Args:
        command: The registry's ``command`` as written.
        anchor_name: The cwd anchor's name (``app``, ``config``, ``workspace``).
        anchor_dir: The anchor's absolute directory.
        path_env: The PATH used for bare names.
        host_python: The interpreter running the host.
        which: ``which(name, path_env)`` for bare names.
        realpath: Symlink resolution, for the escape check.
        is_executable: Whether a candidate file can be executed.

    Returns:
        The resolution with its snapshot ``path`` state and details.
    """
    if not command or "\x00" in command:
        details = PathDetails(base=anchor_name, command=command, portable=False, rootSafe=False)
        return Resolution(state="unresolved", details=details, message="empty command")
    if posixpath.isabs(command) or command.startswith("~"):
        details = PathDetails(base=anchor_name, command=command, portable=False, rootSafe=False)
        return Resolution(
            state="outside-root-denied",
            details=details,
            message=f"absolute command {command!r} is not portable; use a relative or PATH command",
        )
    if "/" not in command:
        if command in HOST_PYTHON_NAMES:
            found: str | None = host_python
        else:
            found = which(command, path_env)
        details = PathDetails(
            base="PATH", command=command, mode="path", portable=True, rootSafe=True, resolved=found
        )
        if found is None:
            return Resolution(
                state="unresolved",
                details=details,
                message=f"command {command!r} not found on PATH",
            )
        return Resolution(state="resolved", details=details, executable=found)
    joined = posixpath.normpath(posixpath.join(anchor_dir, command))
    root = realpath(anchor_dir)
    if not is_inside(anchor_dir, joined) or not is_inside(root, realpath(joined)):
        details = PathDetails(
            base=anchor_name, command=command, mode="relative", portable=True, rootSafe=False
        )
        return Resolution(
            state="outside-root-denied",
            details=details,
            message=f"command {command!r} leaves its {anchor_name} anchor",
        )
    details = PathDetails(
        base=anchor_name,
        command=command,
        mode="relative",
        portable=True,
        rootSafe=True,
        resolved=joined,
    )
    if not is_executable(joined):
        return Resolution(
            state="unresolved",
            details=details,
            message=f"command {command!r} is not an executable file under the {anchor_name} anchor",
        )
    return Resolution(state="resolved", details=details, executable=joined)
