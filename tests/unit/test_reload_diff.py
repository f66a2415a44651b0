"""What a registry reload does, decided from two plans without trio (host/reload.py)."""

from __future__ import annotations

import msgspec
import pytest

from supervisor.contracts.registry import HostConfig, SidecarConfig
from supervisor.host.reload import ReloadResult, diff_plans, needs_restart
from supervisor.registry.load import SidecarEntry
from supervisor.registry.plan import Plan, SidecarPlan, ToolPlan


def sidecar(sid: str, fingerprint: bytes = b"v1", argv: list[str] | None = None) -> SidecarPlan:
    cfg = SidecarConfig(command="python", tools=[f"{sid}.t"])
    entry = SidecarEntry(
        id=sid,
        source="reg",
        config_dir="/",
        config=cfg,
        tools=[f"{sid}.t"],
        fingerprint=fingerprint,
    )
    return SidecarPlan(id=sid, entry=entry, argv=argv or ["python", f"{sid}.py"], runnable=True)


def invalid(sid: str) -> SidecarPlan:
    entry = SidecarEntry(
        id=sid, source="reg", config_dir="/", config=None, errors=["command: required"]
    )
    return SidecarPlan(id=sid, entry=entry)


def tool(name: str, sid: str) -> ToolPlan:
    return ToolPlan(name=name, sidecar=sid, protocol="process-json", manifest=None, discovery="ok")


def plan(*sidecars: SidecarPlan) -> Plan:
    return Plan(
        sidecars={sp.id: sp for sp in sidecars},
        tools={f"{sp.id}.t": tool(f"{sp.id}.t", sp.id) for sp in sidecars if sp.config},
    )


@pytest.mark.parametrize(
    ("old", "new", "running", "expect"),
    [
        # sidecars in the old plan, in the new one, running; what the diff says
        ([], ["a"], set(), {"added": ["a"], "start": ["a"]}),
        (["a"], [], {"a"}, {"removed": ["a"], "stop": ["a"]}),
        (["a"], ["a"], {"a"}, {"unchanged": ["a"]}),
        (
            ["a", "b"],
            ["b", "c"],
            {"a", "b"},
            {
                "added": ["c"],
                "removed": ["a"],
                "unchanged": ["b"],
                "stop": ["a"],
                "start": ["c"],
            },
        ),
    ],
)
def test_added_removed_unchanged(old, new, running, expect):
    diff = diff_plans(plan(*map(sidecar, old)), plan(*map(sidecar, new)), running)
    for field in ("added", "removed", "restarted", "unchanged", "stop", "start", "kept"):
        assert getattr(diff, field) == expect.get(field, []), field
    assert sorted(diff.plan.sidecars) == sorted(new)


@pytest.mark.parametrize(
    "changed",
    [
        {"fingerprint": b"v2"},  # the entry changed
        {"argv": ["python3", "a.py"]},  # the resolved command changed (a new PATH, a new venv)
    ],
)
def test_a_changed_entry_restarts_its_sidecar(changed):
    old, new = plan(sidecar("a")), plan(sidecar("a", **changed))
    diff = diff_plans(old, new, {"a"})
    assert diff.restarted == ["a"] and diff.stop == ["a"] and diff.start == ["a"]
    assert diff.plan.sidecars["a"] is new.sidecars["a"]


def test_a_running_unchanged_sidecar_keeps_its_own_plan_entry():
    old, new = plan(sidecar("a")), plan(sidecar("a"))
    diff = diff_plans(old, new, {"a"})
    assert diff.plan.sidecars["a"] is old.sidecars["a"]
    # not running: the new entry serves from now on
    assert diff_plans(old, new, set()).plan.sidecars["a"] is new.sidecars["a"]


def test_an_invalid_new_entry_keeps_the_running_configuration():
    old = plan(sidecar("a"), sidecar("b"))
    new = plan(invalid("a"), sidecar("b"))
    diff = diff_plans(old, new, {"a", "b"})
    kept = diff.plan.sidecars["a"]
    assert kept.config is old.sidecars["a"].config
    assert diff.unchanged == ["a", "b"] and diff.stop == [] and diff.start == []
    assert diff.kept == [
        "sidecars.a: new entry invalid (command: required); still running the previous "
        "configuration"
    ]
    assert kept.entry.warnings == diff.kept
    assert diff.plan.tools["a.t"] is old.tools["a.t"]
    # neither plan was changed
    assert old.sidecars["a"].entry.warnings == [] and new.sidecars["a"].config is None
    assert "a.t" not in new.tools


def test_an_invalid_entry_of_a_sidecar_not_running_is_taken_as_it_is():
    old, new = plan(sidecar("a")), plan(invalid("a"))
    diff = diff_plans(old, new, set())
    assert diff.kept == [] and diff.restarted == ["a"]
    assert diff.plan.sidecars["a"] is new.sidecars["a"]


def test_needs_restart_names_the_settings_read_once():
    old = HostConfig()
    new = msgspec.structs.replace(old, socket="/elsewhere.sock", shutdown_grace_ms=1)
    assert needs_restart(old, new) == ["host.socket"]
    assert needs_restart(old, old) == []


def test_reload_summary():
    kept = ReloadResult(applied=False, revision=3, errors=["tools/x.jsonc: bad"])
    assert kept.summary() == "kept the running registry: tools/x.jsonc: bad"
    done = ReloadResult(applied=True, revision=4, added=["a"], needs_restart=["host.socket"])
    assert done.summary() == (
        "revision 4, added a, not applied until toolhost restarts: host.socket"
    )
