"""Autodiscovery of Fractalic ``*.yaml`` manifests (PROTOCOL 3.3): routes, overrides, problems."""

from supervisor.contracts.registry import AutodiscoverConfig
from supervisor.registry.discover import scan_folder

PY = "/host/python"


def test_manifests_become_routes_and_override_scripts(tmp_path):
    folder = tmp_path / "tools"
    folder.mkdir()
    (folder / "greet.py").write_text("print('{}')\n")
    (folder / "greet.yaml").write_text("command: python-cli\nentry: greet.py\n")
    (folder / "impl.py").write_text("print('{}')\n")
    (folder / "other.yaml").write_text("name: other\ncommand: simple-json\nentry: impl.py\n")
    (folder / "plain.py").write_text("print('{}')\n")
    (folder / "bad.yml").write_text("command: cobol\nentry: ../../x.py\n")
    (folder / "out.yaml").write_text("command: bash-cli\nentry: ../x.sh\n")
    (folder / "gone.yaml").write_text("command: bash-cli\nentry: nope.sh\n")
    scan = scan_folder(str(tmp_path), AutodiscoverConfig(path="tools"), host_python=PY)
    assert [s.name for s in scan.scripts] == ["plain"]  # greet.py, impl.py: manifest entries
    greet = scan.routes["greet"]
    assert greet.kind == "cli" and greet.argv == [PY, str(folder / "greet.py")]
    assert greet.source == "tools/greet.yaml"
    assert scan.routes["other"].kind == "simple-json"
    bad = scan.routes["bad"]
    assert bad.kind == "unavailable" and bad.reason.startswith("tools/bad.yml: ")
    assert "unknown command 'cobol'" in bad.reason and "outside the folder" in bad.reason
    assert "outside the folder" in scan.routes["out"].reason
    assert "no such file" in scan.routes["gone"].reason
    assert scan.errors == []
    assert len(scan.stamps) == 7  # 5 manifests + the two entries found


def test_scan_explains_files_that_are_not_tools_and_never_reads_outside(tmp_path):
    root = tmp_path / "app"
    folder = root / "tools"
    folder.mkdir(parents=True)
    secret = tmp_path / "secret.yaml"
    secret.write_text("password: [hunter2\n")
    (folder / "leak.yaml").symlink_to(secret)
    (folder / "sj.py").write_text("print('{}')\n")
    (folder / "sj.yaml").write_text("name: renamed\ncommand: bash-cli\nentry: other.sh\n")
    (folder / "other.sh").write_text("echo hi\n")
    (folder / "_helper.py").write_text("")
    (folder / "notes.txt").write_text("")
    scan = scan_folder(str(root), AutodiscoverConfig(path="tools"), host_python=PY)
    assert "leak" not in scan.routes
    assert scan.errors == ["tools/leak.yaml: links outside the app root; skipped"]
    assert "hunter2" not in repr(scan)
    skipped = dict(scan.skipped)
    assert skipped["tools/sj.py"] == "overridden by the manifest tools/sj.yaml"
    assert skipped["tools/other.sh"].startswith("the entry of a manifest")
    assert skipped["tools/_helper.py"].startswith("a helper")
    assert skipped["tools/notes.txt"].startswith("not a script")
