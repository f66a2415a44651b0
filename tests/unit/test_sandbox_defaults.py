"""Sandbox policy resolution: registry per tool, registry per sidecar, manifest, name default."""

import msgspec
import pytest

from supervisor.contracts.manifest import ToolManifest
from supervisor.contracts.registry import SidecarConfig
from supervisor.policy.sandbox import DEFAULTS, default_for
from supervisor.registry.plan import sandbox_for


@pytest.mark.parametrize(
    ("tool", "expected"),
    [
        ("computer.mouse", "approval-required"),
        ("computer.keyboard", "approval-required"),
        ("browser.evaluate", "approval-required"),
        ("task.background", "approval-required"),
        ("browser.navigate", "allowed"),
        ("file.hash", "allowed"),
    ],
)
def test_defaults_by_name(tool, expected):
    assert default_for(tool) == expected


def cfg(sandbox):
    return msgspec.convert(
        {"command": "x", "tools": ["computer.mouse", "t.x"], "sandbox": sandbox}, SidecarConfig
    )


@pytest.mark.parametrize(
    ("sandbox", "manifest", "tool", "expected"),
    [
        (None, None, "computer.mouse", "approval-required"),
        (None, "allowed", "computer.mouse", "allowed"),  # the manifest says otherwise
        ("denied", "allowed", "computer.mouse", "denied"),  # the registry wins
        ({"computer.mouse": "allowed"}, None, "computer.mouse", "allowed"),
        ({"t.x": "denied"}, None, "computer.mouse", "approval-required"),
        (None, "approval-required", "t.x", "approval-required"),
        (None, None, "t.x", "allowed"),
    ],
)
def test_resolution_order(sandbox, manifest, tool, expected):
    m = ToolManifest(name=tool, sandbox=manifest) if manifest else None
    assert sandbox_for(cfg(sandbox), tool, m) == expected
    assert set(DEFAULTS.values()) <= {"approval-required", "denied"}
