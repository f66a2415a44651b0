"""Confinement in the registry and the manifests (PROTOCOL 1 and 7): validation messages with
their JSON path, family profiles by run recipe, and the host's never-readable files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from supervisor.contracts.registry import NetworkGrant
from supervisor.policy.confine import STRICT
from supervisor.registry.load import load_registry
from supervisor.registry.manifests import bundled_manifest_dir, load_known_catalog

GOOD = {"command": "python", "args": ["-m", "x"], "tools": ["a.b"]}


def load(root: Path, sidecars: dict[str, object], host: dict[str, object] | None = None):
    path = root / "tools" / "external.tools.jsonc"
    path.parent.mkdir(parents=True, exist_ok=True)
    doc: dict[str, object] = {"schemaVersion": 2, "sidecars": sidecars}
    if host is not None:
        doc["host"] = host
    path.write_text(json.dumps(doc))
    return load_registry(root, use_global=False)


@pytest.mark.parametrize(
    ("confine", "message"),
    [
        ({"project": "all"}, 'sidecars.s.confine.project: invalid value "all"'),
        ({"network": "some"}, 'sidecars.s.confine.network: invalid value "some"'),
        ({"network": {"allow": "*"}}, "sidecars.s.confine.network.allow: expected array"),
        (
            {"network": {"allow": ["*", "example.com"]}},
            "sidecars.s.confine.network.allow[1]: 'example.com': expected host:port",
        ),
        (
            {"network": {"allow": ["example.com:99999"]}},
            "sidecars.s.confine.network.allow[0]: 'example.com:99999': the port must be",
        ),
        (
            {"network": {"loopback": [0]}},
            "sidecars.s.confine.network.loopback[0]: expected int >= 1",
        ),
        (
            {"network": {"loopback": [9222, 9222]}},
            "sidecars.s.confine.network.loopback: a port is listed twice",
        ),
        ({"network": {"proxy": True}}, "sidecars.s.confine.network.proxy: unknown field"),
        ({"read": ["~/data"]}, "sidecars.s.confine.read[0]: '~/data': ~ is not expanded"),
        ({"write": [""]}, 'sidecars.s.confine.write[0]: expected str of length >= 1, got ""'),
        ({"unix": ["a\u0000b"]}, "sidecars.s.confine.unix[0]: a path cannot hold a NUL byte"),
        ({"processes": 0}, "sidecars.s.confine.processes: expected int >= 1, got 0"),
        ({"keep": "forever"}, 'sidecars.s.confine.keep: invalid value "forever"'),
        ({"folders": ["a/b"]}, "sidecars.s.confine.folders[0]: 'a/b': the name of a folder"),
        ({"folders": [".."]}, "sidecars.s.confine.folders[0]: '..': the name of a folder"),
        ({"cpus": 2}, "sidecars.s.confine.cpus: unknown field"),
    ],
)
def test_bad_profiles_name_the_json_path(tmp_path: Path, confine: object, message: str) -> None:
    reg = load(tmp_path, {"s": {**GOOD, "confine": confine}})
    entry = reg.sidecars["s"]
    assert not entry.valid
    assert any(e.startswith(message) for e in entry.errors), entry.errors


def test_good_profile_and_host_confinement_load(tmp_path: Path) -> None:
    confine = {"project": "write", "network": {"allow": ["*.example.com:443"], "loopback": [9222]}}
    reg = load(tmp_path, {"s": {**GOOD, "confine": confine}}, {"confinement": "required"})
    assert reg.sidecars["s"].valid and reg.host.confinement == "required"
    cfg = reg.sidecars["s"].config
    assert cfg is not None and cfg.confine.network == NetworkGrant(
        allow=["*.example.com:443"], loopback=[9222]
    )
    bad = load(tmp_path, {"s": GOOD}, {"confinement": "maybe"})
    assert bad.host.confinement == "best-effort"  # the default (PROTOCOL 7)
    assert any("host.confinement" in e for e in bad.errors)


def test_bundled_families_carry_their_profiles_and_apply_by_run_recipe(tmp_path: Path) -> None:
    known = load_known_catalog([bundled_manifest_dir()])
    assert not known.errors
    reg = load(
        tmp_path,
        {
            "web": {"command": "python", "args": ["-m", "sidecars.web"], "tools": ["web.fetch"]},
            "myweb": {"command": "python3", "args": ["-m", "sidecars.web"]},
            "tweaked": {
                "command": "python",
                "args": ["-m", "sidecars.web"],
                "confine": {"network": "none", "processes": 8},
            },
            "utility": {"command": "python", "args": ["-m", "sidecars.utility"]},
            "tasks_die": {
                "command": "python",
                "args": ["-m", "sidecars.utility"],
                "confine": {"keep": "worker"},
            },
            "browser": {"command": "python", "args": ["-m", "sidecars.browser_cdp"]},
            "computer": {"command": "python", "args": ["-m", "sidecars.computer"]},
            "impostor": {"command": "node", "args": ["-m", "sidecars.web"], "tools": ["web.fetch"]},
            "mcp": {"command": "npx", "args": ["some-server"], "protocol": "mcp"},
        },
    )
    profile = {sid: known.profile_for(e.config) for sid, e in reg.sidecars.items() if e.config}
    web = profile["web"]
    assert web.project == "write" and web.network == NetworkGrant(allow=["*"])
    assert profile["myweb"] == web  # the code decides, not the sidecar id
    assert profile["tweaked"].network == "none" and profile["tweaked"].project == "write"
    assert profile["tweaked"].processes == 8
    assert profile["utility"].project == "write" and profile["utility"].network == "none"
    assert profile["utility"].keep == "host"  # task.background's keepers (and detach)
    assert profile["tasks_die"].keep == "worker" and profile["tasks_die"].project == "write"
    assert web.keep == "worker" and STRICT.keep == "worker"
    assert profile["browser"].network == NetworkGrant(loopback=[9222])
    assert profile["computer"].unix == ("/tmp/.X11-unix",)
    assert profile["impostor"] == STRICT  # serving web.fetch is not running the web code
    assert profile["mcp"] == STRICT


def test_a_manifest_with_a_bad_profile_is_reported(tmp_path: Path) -> None:
    (tmp_path / "x.toml").write_text('[confine]\nnetwork = { allow = ["nope"] }\n')
    known = load_known_catalog([tmp_path])
    assert known.errors and "x.toml: confine.network.allow[0]: 'nope'" in known.errors[0]


def test_host_secrets_are_the_state_and_registry_files_not_the_code(tmp_path: Path) -> None:
    reg = load(tmp_path, {"s": GOOD}, {"auditLog": "logs/audit.jsonl", "ws": {}})
    root = str(tmp_path)
    secrets = reg.host_secrets()
    assert f"{root}/.toolhost" in secrets
    assert f"{root}/logs/audit.jsonl" in secrets
    assert f"{root}/tools/external.tools.jsonc" in secrets
    assert f"{root}/tools" not in secrets and f"{root}/manifests" not in secrets
    private = reg.host_private([], [])
    assert set(secrets) <= set(private) and f"{root}/tools" in private
