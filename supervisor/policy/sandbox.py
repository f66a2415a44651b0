"""Sandbox defaults by tool name, for tools whose manifest and registry entry say nothing.

The registry (``sidecars.<id>.sandbox``, per sidecar or per tool) wins, then the tool's manifest
``sandbox``, then this table, then ``allowed``. The table names the atomic tools that act on the
user's machine or run arbitrary code in someone else's context (docs/quotas-and-limits.md lists
every family and why).
"""

from __future__ import annotations

from typing import Literal

SandboxPolicy = Literal["allowed", "approval-required", "denied"]

DEFAULTS: dict[str, SandboxPolicy] = {
    "computer.mouse": "approval-required",
    "computer.keyboard": "approval-required",
    "computer.use": "approval-required",
    "browser.evaluate": "approval-required",
    "task.background": "approval-required",
}


def default_for(tool: str) -> SandboxPolicy:
    """The default policy of ``tool`` when nobody configured one."""
    return DEFAULTS.get(tool, "allowed")
