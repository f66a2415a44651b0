"""Autodiscovery: which files become tools, the synthetic sidecar, registry override, the
registry's ``autodiscover`` forms; the catalog's precedence for announced and discovered tools."""

import json
import os

import msgspec
import pytest

from supervisor.contracts.registry import AutodiscoverConfig
from supervisor.contracts.wire import ToolInfo
from supervisor.registry.catalog import CatalogState, SidecarFacts
from supervisor.registry.discover import add_discovered, scan_all, scan_folder
from supervisor.registry.load import load_registry
from supervisor.registry.manifests import load_known_catalog
from supervisor.registry.plan import build_plan

PY = "/host/python"


def make(folder, name, text="print('{}')\n", mode=0o644):
    path = folder / name
    path.write_text(text)
    path.chmod(mode)
    return path


def test_scan_picks_scripts_and_skips_the_rest(tmp_path):
    auto = tmp_path / "tools" / "auto"
    auto.mkdir(parents=True)
    make(auto, "weather.py")
    make(auto, "hello.sh", mode=0o755)
    make(auto, "notes.txt")  # not executable, not Python
    make(auto, "_helpers.py")  # helper module
    make(auto, ".hidden.py")
    make(auto, "bad name.py")
    make(auto, "weather.sh", mode=0o755)  # same tool name as weather.py
    (auto / "sub").mkdir()
    make(auto / "sub", "deep.py")  # not recursive
    scan = scan_folder(str(tmp_path), AutodiscoverConfig(path="tools/auto"), host_python=PY)
    assert [(s.name, s.argv) for s in scan.scripts] == [
        ("hello", [str(auto / "hello.sh")]),
        ("weather", [PY, str(auto / "weather.py")]),
    ]
    assert scan.sidecar == "auto:tools/auto"
    assert any("'bad name' is not a valid tool name" in e for e in scan.errors)
    assert any("weather.sh: tool weather is already served" in e for e in scan.errors)


@pytest.mark.parametrize(
    ("path", "fragment"),
    [("missing", "no such folder"), ("/abs", "relative path"), ("../out", "inside the app root")],
)
def test_unusable_folders_are_reported(tmp_path, path, fragment):
    scan = scan_folder(str(tmp_path), AutodiscoverConfig(path=path), host_python=PY)
    assert scan.scripts == [] and fragment in scan.errors[0]


def test_a_symlink_out_of_the_root_is_skipped(tmp_path):
    root, outside = tmp_path / "app", tmp_path / "outside"
    (root / "auto").mkdir(parents=True)
    outside.mkdir()
    make(outside, "evil.py")
    os.symlink(outside / "evil.py", root / "auto" / "evil.py")
    scan = scan_folder(str(root), AutodiscoverConfig(path="auto"), host_python=PY)
    assert scan.scripts == [] and "links outside the app root" in scan.errors[0]


def registry(tmp_path, doc):
    path = tmp_path / "tools" / "external.tools.jsonc"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc))
    return load_registry(tmp_path, use_global=False)


def test_registry_autodiscover_forms_and_errors(tmp_path):
    reg = registry(
        tmp_path,
        {
            "schemaVersion": 2,
            "autodiscover": ["tools/auto", {"path": "tools/slow", "probeTimeoutMs": 900}],
        },
    )
    assert [(a.path, a.probe_timeout_ms) for a in reg.autodiscover] == [
        ("tools/auto", 200),
        ("tools/slow", 900),
    ]
    reg = registry(tmp_path, {"schemaVersion": 2, "autodiscover": [{"path": "x", "probe": 1}]})
    assert any("autodiscover[0].probe: unknown field" in e for e in reg.errors), reg.errors


def plan_with(tmp_path, sidecars, manifests=None):
    auto = tmp_path / "tools" / "auto"
    auto.mkdir(parents=True, exist_ok=True)
    for name in ("weather.py", "echo.say.py", "file.hash.py", "git.status.py"):
        if not (auto / name).exists():
            make(auto, name)
    reg = registry(
        tmp_path, {"schemaVersion": 2, "autodiscover": ["tools/auto"], "sidecars": sidecars}
    )
    folder = tmp_path / "manifests"
    folder.mkdir(exist_ok=True)
    if manifests:
        (folder / "m.toml").write_text(manifests)
    known = load_known_catalog([folder])
    plan = build_plan(reg, known, host_version="0.1.0")
    problems = add_discovered(plan, reg, known, scan_all(reg, host_python=PY), host_version="0.1.0")
    return reg, plan, problems


def test_discovered_tools_join_the_plan_and_the_registry_wins(tmp_path):
    echo = {"command": "python", "args": ["e.py"], "tools": ["echo.say"]}
    manifest = '[[tool]]\nname = "file.hash"\nreadOnly = true\n'
    _, plan, problems = plan_with(tmp_path, {"echo": echo}, manifest)
    assert plan.tools["echo.say"].sidecar == "echo"  # the registry entry keeps its tool
    assert any("echo.say is served by sidecar echo" in p for p in problems)
    sp = plan.sidecars["auto:tools/auto"]
    assert sp.runnable and sp.config.protocol == "simple-json" and sp.config.probe.interval_ms == 0
    assert set(sp.scripts) == {"weather", "file.hash", "git.status"}
    weather = plan.tools["weather"]
    assert weather.autodiscovered and weather.protocol == "simple-json"
    assert weather.path_details.command == "./tools/auto/weather.py"
    # A known tool nobody served is now served by its script, with its manifest.
    fh = plan.tools["file.hash"]
    assert fh.discovery == "configured" and fh.manifest.read_only
    # Builtin namespaces are refused for scripts too.
    assert plan.tools["git.status"].manifest_state == "invalid"
    assert plan.tools["git.status"].reasons["manifest"].code == "duplicates-builtin"


def test_fingerprint_moves_when_a_script_changes(tmp_path):
    _, plan, _ = plan_with(tmp_path, {})
    before = plan.sidecars["auto:tools/auto"].fingerprint
    _, plan, _ = plan_with(tmp_path, {})
    assert plan.sidecars["auto:tools/auto"].fingerprint == before
    path = tmp_path / "tools" / "auto" / "weather.py"
    path.write_text("print('{\"v\": 2}')\n")
    os.utime(path, ns=(1, 1))
    _, plan, _ = plan_with(tmp_path, {})
    assert plan.sidecars["auto:tools/auto"].fingerprint != before


def announce(*names):
    return {n: ToolInfo(name=n, description=f"{n} from mcp") for n in names}


def test_catalog_an_announcing_registry_sidecar_overrides_a_discovered_tool(tmp_path):
    mcp = {"command": "python", "args": ["s.py"], "protocol": "mcp"}
    manifest = (
        '[[tool]]\nname = "remote.only"\ndescription = "from the manifest"\n'
        'inputSchema = { type = "object", required = ["q"] }\n'
    )
    _, plan, _ = plan_with(tmp_path, {"mcp": mcp}, manifest)
    cat = CatalogState()
    cat.load(plan)
    assert cat.get("remote.only").stability.discovery == "missing"
    cat.update_sidecar("auto:tools/auto", SidecarFacts(runtime="ready"))
    assert cat.get("weather").sidecar == "auto:tools/auto"
    cat.update_sidecar(
        "mcp", SidecarFacts(runtime="ready", announced=announce("weather", "remote.only"))
    )
    weather = cat.get("weather")
    assert weather.sidecar == "mcp" and weather.protocol == "mcp" and weather.visible
    remote = cat.get("remote.only")
    assert remote.sidecar == "mcp" and remote.visible
    assert remote.description == "from the manifest"  # the manifest wins on schema
    assert remote.inputSchema["required"] == ["q"]
    assert cat.tool_plan("remote.only").manifest is not None
    # The server stops announcing weather: the discovered script serves it again.
    cat.update_sidecar("mcp", SidecarFacts(runtime="ready", announced=announce("remote.only")))
    assert cat.get("weather").sidecar == "auto:tools/auto"


def test_catalog_drops_a_tool_the_server_no_longer_announces(tmp_path):
    mcp = {"command": "python", "args": ["s.py"], "protocol": "mcp"}
    _, plan, _ = plan_with(tmp_path, {"mcp": mcp})
    cat = CatalogState()
    cat.load(plan)
    changed = cat.update_sidecar("mcp", SidecarFacts(runtime="ready", announced=announce("a", "b")))
    assert {d.name for d in changed} == {"a", "b"}
    revision = cat.revision
    changed = cat.update_sidecar("mcp", SidecarFacts(runtime="ready", announced=announce("a")))
    assert changed == [] and cat.get("b") is None and cat.revision == revision + 1
    assert cat.get("a").visible


def test_schema_of_autodiscover_entries_is_strict():
    with pytest.raises(msgspec.ValidationError):
        msgspec.convert({"path": "x", "probeTimeoutMs": 0}, AutodiscoverConfig)


def test_a_tool_two_mcp_servers_announce_belongs_to_the_first_in_the_registry(tmp_path):
    alpha = {"command": "python", "args": ["a.py"], "protocol": "mcp"}
    beta = {"command": "python", "args": ["b.py"], "protocol": "mcp"}
    _, plan, _ = plan_with(tmp_path, {"alpha": alpha, "beta": beta})
    assert list(plan.sidecars)[:2] == ["alpha", "beta"]
    cat = CatalogState()
    cat.load(plan)
    # beta is ready first: it serves the name meanwhile.
    cat.update_sidecar("beta", SidecarFacts(runtime="ready", announced=announce("touch")))
    assert cat.get("touch").sidecar == "beta"
    # alpha, first in the registry, announces it too: it owns it from now on.
    cat.update_sidecar("alpha", SidecarFacts(runtime="ready", announced=announce("touch")))
    assert cat.get("touch").sidecar == "alpha" and cat.owner("touch") == "alpha"


def test_a_folder_s_confine_reaches_its_sidecar(tmp_path):
    # PROTOCOL 7: an autodiscover folder's scripts run confined; its `confine` is their profile.
    auto = tmp_path / "tools" / "auto"
    auto.mkdir(parents=True)
    make(auto, "weather.py")
    doc = {
        "schemaVersion": 2,
        "autodiscover": [{"path": "tools/auto", "confine": {"write": ["out"], "project": "none"}}],
    }
    reg = registry(tmp_path, doc)
    assert not reg.errors, reg.errors
    known = load_known_catalog([])
    plan = build_plan(reg, known, host_version="0.1.0")
    add_discovered(plan, reg, known, scan_all(reg, host_python=PY), host_version="0.1.0")
    profile = known.profile_for(plan.sidecars["auto:tools/auto"].config)
    assert profile.write == ("out",) and profile.project == "none"
    bad = registry(tmp_path, {"schemaVersion": 2, "autodiscover": [{"path": "x", "confine": 1}]})
    assert any("autodiscover[0].confine" in e for e in bad.errors), bad.errors
