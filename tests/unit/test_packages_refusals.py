"""A refused package operation changes nothing: every refusal path of ``toolhost pkg stage``,
``apply`` and ``rollback`` (run without a host, so the CLI runs the transaction itself, recovery
first) leaves every byte of the app root as it was.

The only file an operation may touch before refusing is the lock file ``tools/packages/.lock``
(it holds the pid of its last holder); it is compared by existence, not content.
"""

from __future__ import annotations

import json
import os
import shutil
import tarfile
from pathlib import Path
from typing import Any

import json5
import pytest

from supervisor.cli.main import main
from supervisor.packages.fsio import FileLock
from supervisor.packages.manager import PackageManager
from tests.pkgkit import build

LOCK = "tools/packages/.lock"


def snapshot(root: Path) -> dict[str, Any]:
    """Every folder, file (bytes and mode) and link under ``root``."""
    out: dict[str, Any] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            rel = str(p.relative_to(root))
            st = p.lstat()
            if p.is_symlink():
                out[rel] = ("l", os.readlink(p))
            elif p.is_dir():
                out[rel] = ("d", st.st_mode)
            elif rel == LOCK:
                out[rel] = ("lock",)
            else:
                out[rel] = ("f", st.st_mode, p.read_bytes())
    return out


@pytest.fixture
def env(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    root = tmp_path / "app"
    (root / "tools").mkdir(parents=True)
    src = tmp_path / "src"
    src.mkdir()
    return root, src


def pkg(root: Path, *args: str) -> int:
    return main(["pkg", *args, "--app-root", str(root)])


def refused(root: Path, capsys: pytest.CaptureFixture[str], *args: str, code: str) -> str:
    """Run a command that must be refused; assert the tree is unchanged; return stderr."""
    before = snapshot(root)
    capsys.readouterr()
    rc = pkg(root, *args)
    err = capsys.readouterr().err
    assert rc != 0, err
    assert f"toolhost: {code}:" in err, err
    after = snapshot(root)
    changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    assert changed == [], f"{' '.join(args)} was refused but changed {changed}"
    return err


@pytest.fixture
def installed(env, capsys):
    """greet 1.0.0 then 1.1.0 applied (1.0.0 is the previous version), 1.2.0 staged."""
    root, src = env
    for version in ("1.0.0", "1.1.0"):
        assert pkg(root, "stage", str(build(src, version))) == 0
        assert pkg(root, "apply", "greet") == 0
    assert pkg(root, "stage", str(build(src, "1.2.0"))) == 0
    assert (root / "tools" / "external.tools.jsonc.next").exists()
    capsys.readouterr()
    return root, src


def break_registry(root: Path) -> None:
    (root / "tools" / "external.tools.jsonc").write_text('{ "schemaVersion": 2, "sidecars": {')


def make_entry_invalid_for(root: Path, tools: list[str]) -> None:
    """An operator setting that names a tool the next version no longer serves."""
    reg = root / "tools" / "external.tools.jsonc"
    doc = json5.loads(reg.read_text())
    doc["sidecars"]["greet"]["sandbox"] = {t: "approval-required" for t in tools}
    reg.write_text(json.dumps(doc))


# stage ---------------------------------------------------------------------------------------


def test_stage_refusals_change_nothing(installed, capsys, tmp_path):
    root, src = installed
    refused(root, capsys, "stage", str(tmp_path / "nothing-here"), code="not-found")
    (tmp_path / "notes.txt").write_text("not a package")
    refused(root, capsys, "stage", str(tmp_path / "notes.txt"), code="invalid-package")
    bad = build(src / "a", "2.0.0", toml={"version": None, "checksum": None})
    err = refused(root, capsys, "stage", str(bad), code="invalid-package")
    assert "  - package.toml: version: required field missing" in err
    assert "  - package.toml: checksum: required field missing" in err
    bad = build(src / "b", "2.0.0", toml={"checksum": "sha256:" + "3" * 64})
    refused(root, capsys, "stage", str(bad), code="checksum-mismatch")
    bad = build(src / "c", "2.0.0", toml={"compatibleCore": ">=99"})
    refused(root, capsys, "stage", str(bad), code="incompatible")
    refused(root, capsys, "stage", str(build(src / "d", "1.1.0")), code="conflict")
    evil = tmp_path / "evil.tar.gz"
    with tarfile.open(evil, "w:gz") as tf:
        tf.add(build(src / "e", "2.0.0"), arcname="../escape")
    refused(root, capsys, "stage", str(evil), code="invalid-package")
    shutil.copy(root / "tools" / "external.tools.jsonc", tmp_path / "registry.bak")
    make_entry_invalid_for(root, ["greet.version"])
    other = build(src / "f", "2.0.0", tools=["greet.other"])
    refused(root, capsys, "stage", str(other), code="invalid-package")
    break_registry(root)
    refused(root, capsys, "stage", str(build(src / "g", "2.0.0")), code="conflict")


def test_a_refused_first_package_leaves_no_trace(env, capsys):
    root, src = env
    (root / "tools" / "external.tools.jsonc").write_text('{"schemaVersion": 2, "sidecars": {}}')
    bad = build(src, "1.0.0", toml={"command": "/bin/sh", "checksum": None})
    err = refused(root, capsys, "stage", str(bad), code="invalid-package")
    assert "absolute paths are refused" in err and "checksum: required field missing" in err
    assert not (root / "tools" / "packages").exists()
    break_registry(root)
    refused(root, capsys, "stage", str(build(src / "ok", "1.0.0")), code="conflict")
    assert not (root / "tools" / "packages").exists()


def test_a_busy_lock_refuses_without_writing(installed, capsys):
    root, src = installed
    holder = FileLock(root / LOCK)
    holder.acquire()
    try:
        refused(root, capsys, "stage", str(build(src / "x", "2.0.0")), code="busy")
        refused(root, capsys, "apply", "greet", code="busy")
        refused(root, capsys, "rollback", "greet", "--yes", code="busy")
    finally:
        holder.release()


# apply ---------------------------------------------------------------------------------------


def test_apply_with_an_unparseable_registry_changes_nothing(installed, capsys):
    root, _ = installed
    break_registry(root)
    err = refused(root, capsys, "apply", "greet", code="conflict")
    assert "not valid JSONC" in err
    assert (root / "tools" / "external.tools.jsonc.next").exists()  # still the good one
    json5.loads((root / "tools" / "external.tools.jsonc.next").read_text())


def test_apply_refusals_change_nothing(installed, capsys):
    root, _ = installed
    refused(root, capsys, "apply", "../etc", code="not-found")
    refused(root, capsys, "apply", "other", code="not-found")
    make_entry_invalid_for(root, ["greet.version", "greet.gone"])
    refused(root, capsys, "apply", "greet", code="invalid-package")


def test_apply_of_a_staged_package_tampered_with_changes_nothing(installed, capsys):
    root, _ = installed
    staged = root / "tools" / "packages" / ".staging" / "greet@1.2.0"
    (staged / "share" / "behaviour.json").write_text('{"version": "evil"}')
    refused(root, capsys, "apply", "greet", code="checksum-mismatch")


# rollback ------------------------------------------------------------------------------------


def test_rollback_refusals_change_nothing(installed, capsys):
    root, _ = installed
    refused(root, capsys, "rollback", "other", "--yes", code="not-found")
    before = snapshot(root)
    assert pkg(root, "rollback", "greet") == 64  # no --yes: a usage error
    assert snapshot(root) == before
    make_entry_invalid_for(root, ["greet.version", "greet.gone"])
    refused(root, capsys, "rollback", "greet", "--yes", code="invalid-package")
    break_registry(root)
    refused(root, capsys, "rollback", "greet", "--yes", code="conflict")


def test_rollback_to_a_previous_version_tampered_with_changes_nothing(installed, capsys):
    root, _ = installed
    previous = root / "tools" / "packages" / ".previous" / "greet"
    (previous / "share" / "extra").write_text("not in the checksum")
    refused(root, capsys, "rollback", "greet", "--yes", code="checksum-mismatch")
    assert PackageManager(root).staged() == {"greet": "greet@1.2.0"}
