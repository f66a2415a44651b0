"""Host-private paths (PROTOCOL 1): what no tool may read or write, whatever ``projectDir`` says.

The host's own files are the gates: the operator and gateway tokens, the vault, the audit log,
the quota state (all in ``<appRoot>/.toolhost/``), the registry and manifest files that name what
runs, the sidecars' code and packages (``tools/``) and the host's installation. A file tool that
could write one of them could approve its own call, read every secret, wipe the audit trail or
make the host run a command of its choosing. So every path a tool touches is checked against
this list after symlinks are resolved, and the list holds both the path as configured and its
real path (a ``.toolhost`` that is itself a symlink is private under both names).

# Strategy: pure functions over absolute path strings; ``realpath`` is injected so the rules are
# table-testable. The host computes the list once per registry load and hands it to every worker
# (``hostPrivate`` in the process-json ``init`` line and the oneshot request); the SDK's
# ``sidecars.sdk.paths.confine`` refuses a match with reason ``host-private``.
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Callable, Iterable

STATE_DIR = ".toolhost"
"""The host's state folder under the app root: tokens, vault, audit, quota state, socket."""
CODE_DIR = "tools"
"""Sidecar code, packages and autodiscover folders under the app root (and the registry)."""
MANIFEST_DIR = "manifests"


def private_roots(
    *,
    app_root: str,
    files: Iterable[str] = (),
    folders: Iterable[str] = (),
    realpath: Callable[[str], str] = os.path.realpath,
) -> tuple[str, ...]:
    """Every host-private path, absolute, as configured and resolved, without duplicates.

    Args:
        app_root: The absolute application root; its ``.toolhost/``, ``tools/`` and
            ``manifests/`` are always private.
        files: Further absolute files the host reads or writes (registry files, token files,
            the audit log and quota state wherever the registry puts them, the socket).
        folders: Further absolute folders (autodiscover folders, manifest folders, the host's
            installation).
        realpath: Symlink resolution (``os.path.realpath`` outside tests).

    Returns:
        Normalised absolute paths; a path is private when it is one of them or below one.
    """
    out: list[str] = []
    candidates = [
        posixpath.join(app_root, STATE_DIR),
        posixpath.join(app_root, CODE_DIR),
        posixpath.join(app_root, MANIFEST_DIR),
        *files,
        *folders,
    ]
    for path in candidates:
        if not path or not posixpath.isabs(path):
            continue
        for form in (posixpath.normpath(path), posixpath.normpath(realpath(path))):
            if form != "/" and form not in out:
                out.append(form)
    return tuple(out)


def private_match(path: str, roots: Iterable[str]) -> str | None:
    """The private root that ``path`` (absolute, normalised) is or lies under, or None."""
    for root in roots:
        if path == root or path.startswith(root.rstrip("/") + "/"):
            return root
    return None
