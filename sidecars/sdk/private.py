"""The host-private paths of this sidecar process (PROTOCOL 1): what no tool may read or write.

Set once from the host's ``init`` line (``hostPrivate``) or a oneshot request; read by
:func:`sidecars.sdk.paths.confine` and the tools that walk folders. A module of its own, with no
SDK import, so the app can set it and the path rules can read it without an import circle.
"""

from __future__ import annotations

import os

from supervisor.policy.host_private import private_match

_SDK_INSTALL = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
_host_private: tuple[str, ...] = (_SDK_INSTALL,)


def set_host_private(paths: list[str]) -> None:
    """Set the host-private paths (absolute) this process's tools must never touch.

    Args:
        paths: From the host's ``init`` line (``hostPrivate``); relative or non-string entries
            are ignored. The SDK's own installation is always added.
    """
    global _host_private
    roots = [_SDK_INSTALL]
    for path in paths:
        if isinstance(path, str) and os.path.isabs(path):
            for form in (os.path.normpath(path), os.path.realpath(path)):
                if form != "/" and form not in roots:
                    roots.append(form)
    _host_private = tuple(roots)


def host_private(path: str | os.PathLike[str]) -> str | None:
    """The host-private root that the absolute ``path`` is or lies under, or None."""
    return private_match(os.path.normpath(os.fspath(path)), _host_private)
