"""Helpers shared by the CLI commands: locating the app root and the socket, exit codes."""

from __future__ import annotations

import argparse
import contextlib
import errno
import gc
import json
import logging
import os
import sys
from typing import Any

from supervisor.packages.fsio import FileLock
from supervisor.registry.load import load_registry

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_UNAVAILABLE = 2
EXIT_NO_HOST = 3
EXIT_USAGE = 64


def app_root(args: argparse.Namespace) -> str:
    root = getattr(args, "app_root", None) or os.environ.get("TOOLHOST_APP_ROOT") or os.getcwd()
    return os.path.abspath(root)


SERVING_FILE = os.path.join(".toolhost", "serving.json")
"""Under the app root: what the running ``toolhost serve`` listens on (its pid, socket and
gateway), written once it listens and removed when it ends. The CLI reads it before the
registry, whose ``host.socket`` may have been edited since (a reload does not move the socket)."""

HOST_LOCK = os.path.join(".toolhost", "host.lock")
"""Under the app root: an ``flock`` held by the one host running on it (``toolhost serve``, or
``toolhost mcp --embedded``) for as long as it runs, its pid inside. Two hosts on one root would
each count quotas, overwrite ``.toolhost/quota-state.json`` and run every sidecar twice."""


HOST_ROLES = {"serve": "`toolhost serve`", "embedded": "`toolhost mcp --embedded`"}
"""What a host writes after its pid in :data:`HOST_LOCK`, and how a refusal names it."""


class RootTaken(Exception):
    """Another host runs on the app root (the message names it and what to do); ``holder``:
    its pid as written in the lock ("" when the lock itself is the problem); ``role``: what it
    is (a key of :data:`HOST_ROLES`; "" when it did not say: a version before roles)."""

    def __init__(self, message: str, holder: str = "", role: str = "") -> None:
        super().__init__(message)
        self.holder = holder
        self.role = role


def lock_root(root: str, advice: str, role: str) -> FileLock | None:
    """Take :data:`HOST_LOCK` for this process's host (``role``: what it is, a key of
    :data:`HOST_ROLES`, written after its pid); release it when the host ends. ``advice`` ends
    the refusal: what this command's user can do instead. None (and a warning) when the lock
    cannot be made at all (a read-only app root): then there is no state there for a second
    host to overwrite either.

    Raises:
        RootTaken: Another host holds it, or the lock file is a symlink (one line).
    """
    lock = FileLock(os.path.join(root, HOST_LOCK), role=role)
    try:
        os.makedirs(lock.path.parent, mode=0o700, exist_ok=True)
        if lock.try_acquire():
            return lock
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # planted, as a symlinked audit log would be: refuse
            raise RootTaken(f"cannot lock {lock.path}: it is a symlink; remove it") from exc
        logging.getLogger("toolhost").warning(
            "cannot lock %s (%s): a second host on this app root would not be refused",
            lock.path,
            exc.strerror or exc,
        )
        return None
    holder, held_as = lock.holder(), lock.holder_role()
    what = HOST_ROLES.get(held_as, "`toolhost serve` or `toolhost mcp --embedded`")
    raise RootTaken(
        f"another toolhost host (pid {holder}: {what}) already runs on {root}; two would each "
        f"count quotas and overwrite its state. {advice}",
        holder,
        held_as if held_as in HOST_ROLES else "",
    )


def serving_pid(root: str) -> int | None:
    """The pid of the ``toolhost serve`` that recorded :data:`SERVING_FILE` under ``root``."""
    pid = _serving_record(os.path.join(root, SERVING_FILE)).get("pid")
    return pid if isinstance(pid, int) else None


def write_serving(root: str, endpoints: dict[str, str]) -> None:
    """Record this process's endpoints in :data:`SERVING_FILE` (atomically, mode 0600)."""
    path = os.path.join(root, SERVING_FILE)
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    endpoints = dict(endpoints)
    if "unix" in endpoints:
        endpoints["unix"] = os.path.abspath(endpoints["unix"])
    tmp = f"{path}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump({"pid": os.getpid(), **endpoints}, f)
    os.replace(tmp, path)


def remove_serving(root: str) -> None:
    """Remove :data:`SERVING_FILE` if this process wrote it."""
    path = os.path.join(root, SERVING_FILE)
    if _serving_record(path).get("pid") == os.getpid():
        with contextlib.suppress(OSError):
            os.unlink(path)


def _serving_record(path: str) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as f:
            record = json.load(f)
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def served_socket(root: str) -> str | None:
    """The socket the host running in ``root`` serves, from :data:`SERVING_FILE`; None when
    there is no record, or its process or socket is gone (a host that was killed)."""
    record = _serving_record(os.path.join(root, SERVING_FILE))
    pid, sock = record.get("pid"), record.get("unix")
    if not isinstance(pid, int) or not isinstance(sock, str) or not os.path.exists(sock):
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except OSError:  # alive, another user's
        pass
    return sock


def socket_path(args: argparse.Namespace) -> str:
    """``--socket``, ``$TOOLHOST_SOCKET``, the socket the running host recorded that it serves
    (:data:`SERVING_FILE`), or the registry's ``host.socket`` under the app root."""
    explicit = getattr(args, "socket", None) or os.environ.get("TOOLHOST_SOCKET")
    if explicit:
        return os.path.abspath(explicit)
    root = app_root(args)
    served = served_socket(root)
    if served is not None:
        return served
    reg = load_registry(
        root,
        registry_path=getattr(args, "registry", None),
        use_global=not getattr(args, "no_global", False),
    )
    return reg.path(reg.host.socket)


def add_location_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--app-root", help="application root (default: $TOOLHOST_APP_ROOT or cwd)")
    p.add_argument(
        "--registry", help="registry file (default: <app-root>/tools/external.tools.jsonc)"
    )
    p.add_argument("--no-global", action="store_true", help="ignore the user-global registry")
    p.add_argument("--socket", help="socket path (default: the registry's host.socket)")


def die(message: str, code: int = EXIT_NO_HOST) -> int:
    print(f"toolhost: {message}", file=sys.stderr)
    return code


def freeze_start_up() -> None:
    """Leave what start-up made (imported modules, the registry, the catalog, the pools) out of
    the cyclic collector from now on: a full collection then walks only what serving made since,
    where it walked the ~46,000 start-up objects too (~40 ms, once every few thousand calls, in
    the middle of one of them). Reclaimed by reference counting as before; a cycle among them
    stays (start-up builds them once)."""
    gc.freeze()
