"""Helpers shared by the CLI commands: locating the app root and the socket, exit codes."""

from __future__ import annotations

import argparse
import os
import sys

from supervisor.registry.load import load_registry

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_UNAVAILABLE = 2
EXIT_NO_HOST = 3
EXIT_USAGE = 64


def app_root(args: argparse.Namespace) -> str:
    root = getattr(args, "app_root", None) or os.environ.get("TOOLHOST_APP_ROOT") or os.getcwd()
    return os.path.abspath(root)


def socket_path(args: argparse.Namespace) -> str:
    """``--socket``, ``$TOOLHOST_SOCKET``, or the registry's ``host.socket`` under the app root."""
    explicit = getattr(args, "socket", None) or os.environ.get("TOOLHOST_SOCKET")
    if explicit:
        return os.path.abspath(explicit)
    root = app_root(args)
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
