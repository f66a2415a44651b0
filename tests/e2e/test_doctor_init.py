"""``toolhost doctor`` and ``toolhost init`` work without a running host."""

import json

from tests.conftest import echo, script, write_registry
from tests.e2e.conftest import cli


def test_doctor_reports_each_kind_of_trouble(tmp_path):
    root = tmp_path / "app"
    root.mkdir()
    write_registry(
        root,
        {
            "healthy": echo(tools=["echo.say"]),
            "missing": {"command": "no-such-command-anywhere", "tools": ["missing.tool"]},
            "invalid": {"command": "python", "tools": ["invalid.tool"], "pool": {"max": "lots"}},
            "crashing": script("exit_at_once", ["crash.tool"]),
            "off": {"command": "python", "tools": ["off.tool"], "enabled": False},
        },
    )
    out = cli(root, "doctor", "--json", "--timeout", "20")
    assert out.returncode == 1, out.stderr
    report = json.loads(out.stdout)
    by_id = {s["id"]: s for s in report["sidecars"]}
    assert by_id["healthy"]["ok"] and by_id["healthy"]["tools"] == {"echo.say": "available"}
    assert by_id["off"]["ok"] and by_id["off"]["state"] == "disabled"
    missing = by_id["missing"]
    assert not missing["ok"] and any("command-not-found" in p for p in missing["problems"])
    assert any("no-such-command-anywhere" in h for h in missing["hints"])
    invalid = by_id["invalid"]
    assert not invalid["ok"] and invalid["state"] == "invalid"
    assert any(
        'sidecars.invalid.pool.max: expected int, got "lots"' in p for p in invalid["problems"]
    )
    crashing = by_id["crashing"]
    assert not crashing["ok"] and crashing["state"] == "failed"
    assert any("exit status 7" in p for p in crashing["problems"])
    assert "fatal: missing configuration" in crashing["stderr"]
    assert any("toolhost logs crashing" in h for h in crashing["hints"])
    human = cli(root, "doctor", "--timeout", "20")
    assert human.returncode == 1
    assert "[ok] sidecar healthy" in human.stdout and "[FAIL] sidecar crashing" in human.stdout
    assert "fix:" in human.stdout


def test_doctor_all_healthy_exits_zero(tmp_path):
    root = tmp_path / "app"
    root.mkdir()
    write_registry(root, {"healthy": echo(tools=["echo.say"])})
    out = cli(root, "doctor")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "all configured sidecars are healthy" in out.stdout


def test_init_writes_a_portable_registry_and_refuses_to_overwrite(tmp_path):
    root = tmp_path / "app"
    root.mkdir()
    out = cli(root, "init")
    assert out.returncode == 0, out.stderr
    text = (root / "tools" / "external.tools.jsonc").read_text()
    assert text.startswith("//")
    assert str(tmp_path) not in text  # nothing absolute is written
    doc = json.loads("\n".join(line for line in text.splitlines() if not line.startswith("//")))
    util = doc["sidecars"]["utility"]
    assert util["command"] == "python" and util["args"] == ["-m", "sidecars.utility"]
    assert set(util["tools"]) == {
        "file.hash",
        "archive.create",
        "archive.extract",
        "data.convert",
        # Listed, and unavailable in doctor until config.lspCommand / taskCommand are set.
        "lsp.symbols",
        "lsp.diagnostics",
        "task.background",
    }
    again = cli(root, "init")
    assert again.returncode == 1 and "--force" in again.stderr
    assert cli(root, "init", "--force").returncode == 0
    healthy = cli(root, "doctor")
    assert healthy.returncode == 0, healthy.stdout
