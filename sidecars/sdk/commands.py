"""Delegate commands from a sidecar's config: ``["pylsp"]``, ``["python", "-m", "pylsp"]``.

A sidecar that drives an outside program (a language server, a task runner, an input delegate)
takes it from its ``config`` as an argument list, never a shell string. The first element is
resolved with the registry's portability rules (PROTOCOL 1):

- ``python`` / ``python3`` mean the interpreter running the sidecar (so a delegate installed in
  the same virtual environment works without activating it);
- a bare name is looked up on ``PATH`` (the worker's allow-listed environment);
- a relative path (``./bin/x``, ``tools/x``) resolves against the sidecar's cwd and must stay
  inside it;
- an absolute path is refused (``absolute-command``), as in the registry.

:func:`resolve` answers a :class:`Resolved` (the argv ready for ``subprocess``) or a
:class:`Missing` (why not, with a hint), so a health check can report the reason in ``pong``
before any call and a tool can raise the same reason as ``unavailable``.
"""

from __future__ import annotations

import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sidecars.sdk.tools import ToolError

PYTHON_NAMES = ("python", "python3")


@dataclass(frozen=True)
class Resolved:
    """A usable delegate: ``argv[0]`` is an absolute executable path."""

    argv: list[str]


@dataclass(frozen=True)
class Missing:
    """Why a delegate cannot run: a stable ``reason`` code and a human ``message`` with a hint."""

    reason: str
    message: str

    def error(self, tool: str) -> ToolError:
        """The ``unavailable`` error a tool raises for this cause."""
        return ToolError(
            f"{tool} is unavailable: {self.message}",
            code="unavailable",
            details={"reason": self.reason},
        )


def resolve(config: dict[str, Any], key: str, cwd: str, *, hint: str) -> Resolved | Missing:
    """Resolve the delegate command ``config[key]``.

    Args:
        config: The sidecar's config (from ``init``).
        key: The config key holding the command (``lspCommand``...).
        cwd: The directory relative commands resolve against (the sidecar's cwd).
        hint: What to install or set when the key is absent, e.g. ``pip install
            python-lsp-server, then "lspCommand": ["pylsp"]``.

    Returns:
        :class:`Resolved` with the argv, or :class:`Missing` with the reason.
    """
    raw = config.get(key)
    if raw is None:
        return Missing("not-configured", f"config.{key} is not set ({hint})")
    argv = [raw] if isinstance(raw, str) else raw
    if (
        not isinstance(argv, list)
        or not argv
        or not all(isinstance(a, str) and a and "\x00" not in a for a in argv)
    ):
        return Missing(
            "bad-config",
            f"config.{key} must be a non-empty list of strings (an argument list, no shell)",
        )
    first = argv[0]
    if first in PYTHON_NAMES:
        return Resolved([sys.executable, *argv[1:]])
    if os.path.isabs(first):
        return Missing(
            "absolute-command",
            f"config.{key}[0] {first!r} is absolute; use a bare PATH name or a relative path",
        )
    if "/" in first:
        base = Path(os.path.realpath(cwd))
        path = Path(os.path.realpath(base / first))
        if not path.is_relative_to(base):
            return Missing("outside-root", f"config.{key}[0] {first!r} leaves the sidecar's cwd")
        if not (path.is_file() and os.access(path, os.X_OK)):
            return Missing("not-found", f"config.{key}[0] {first!r} is not an executable file")
        return Resolved([str(path), *argv[1:]])
    found = shutil.which(first)
    if found is None:
        return Missing("not-found", f"{first!r} (config.{key}) was not found on PATH; {hint}")
    return Resolved([found, *argv[1:]])


def require(config: dict[str, Any], key: str, cwd: str, *, hint: str, tool: str) -> list[str]:
    """Like :func:`resolve`, but raise the ``unavailable`` :class:`ToolError` when missing.

    Args:
        config: The sidecar's config.
        key: The config key holding the command.
        cwd: Base directory of relative commands.
        hint: Install hint for the message.
        tool: The tool name for the message.

    Returns:
        The argv, ``argv[0]`` absolute.

    Raises:
        ToolError: ``unavailable`` with ``details.reason``.
    """
    got = resolve(config, key, cwd, hint=hint)
    if isinstance(got, Missing):
        raise got.error(tool)
    return got.argv
