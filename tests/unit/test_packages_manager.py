"""The package manager on disk, without a host: stage, apply, roll back, refuse, recover."""

import json
import shutil

import json5
import pytest

from supervisor.packages.errors import PackageError
from supervisor.packages.fsio import LockBusy
from supervisor.packages.manager import PackageManager
from tests.pkgkit import (
    assert_no_absolute_paths,
    build,
    installed_version,
    registry_entry,
    tree_state,
)

OPERATOR_REGISTRY = """// operator's registry: this comment must survive upgrades
{
  "schemaVersion": 2,
  "sidecars": {
    "greet": {
      "command": "./tools/packages/greet/bin/greet",
      "tools": ["greet.version"],
      "pool": { "min": 1, "max": 3 }, // tuned by hand
      "config": { "greeting": "hi" },
      "env": { "GREET_MODE": "loud" },
      "upgrade": "failed",
    },
  },
}
"""


@pytest.fixture
def app(tmp_path):
    root = tmp_path / "app"
    (root / "tools").mkdir(parents=True)
    return root


@pytest.fixture
def src(tmp_path):
    folder = tmp_path / "src"
    folder.mkdir()
    return folder


def manager(app):
    mgr = PackageManager(app)
    mgr.lock.acquire()
    return mgr


def install(mgr, src, version, **kw):
    mgr.stage(build(src, version, **kw))
    mgr.execute(mgr.prepare_apply("greet"))
    return mgr


def test_stage_writes_staging_and_next_but_not_the_registry(app, src):
    mgr = install(manager(app), src, "1.0.0")
    before = (app / "tools" / "external.tools.jsonc").read_text()
    result = mgr.stage(build(src, "1.1.0", archive=True))
    assert (result.id, result.version, result.installed) == ("greet", "1.1.0", "1.0.0")
    assert result.staged == "tools/packages/.staging/greet@1.1.0"
    assert (app / "tools" / "external.tools.jsonc").read_text() == before
    nxt = json5.loads((app / "tools" / "external.tools.jsonc.next").read_text())
    assert nxt["sidecars"]["greet"]["packageVersion"] == "1.1.0"
    assert installed_version(app, where=".staging") is None  # staged under <id>@<version>
    assert (app / "tools/packages/.staging/greet@1.1.0/package.toml").is_file()
    info = mgr.status().packages[0]
    assert (info.installed, info.staged, info.upgrade) == ("1.0.0", "1.1.0", "applying")
    mgr.settle_verification("greet", "ready", "")
    assert mgr.status().packages[0].upgrade == "staged"
    assert_no_absolute_paths(app)


def test_apply_and_rollback_swap_folders_and_registry(app, src):
    mgr = install(manager(app), src, "1.0.0")
    assert registry_entry(app)["packageVersion"] == "1.0.0"
    assert registry_entry(app)["command"] == "./tools/packages/greet/bin/greet"
    assert mgr.record("greet").state == "verifying"
    assert not (app / "tools" / "external.tools.jsonc.next").exists()  # nothing staged
    mgr.stage(build(src, "1.1.0"))
    txn = mgr.prepare_apply("greet")
    assert [m.step for m in txn.journal.moves] == ["current-moved", "staged-moved"]
    mgr.execute(txn)
    assert installed_version(app) == "1.1.0"
    assert installed_version(app, where=".previous") == "1.0.0"
    assert registry_entry(app)["packageVersion"] == "1.1.0"
    assert not (app / "tools/packages/.journal.json").exists()
    assert not list((app / "tools/packages/.staging").iterdir())
    mgr.stage(build(src, "1.2.0"))
    txn = mgr.prepare_apply("greet")
    assert next(m.step for m in txn.journal.moves) == "previous-trashed"
    mgr.execute(txn)
    assert installed_version(app, where=".previous") == "1.1.0"
    assert not (app / "tools/packages/.trash").exists() or not any(
        (app / "tools/packages/.trash").iterdir()
    )
    mgr.execute(mgr.prepare_rollback("greet"))
    assert installed_version(app) == "1.1.0"
    assert installed_version(app, where=".previous") == "1.2.0"  # a rollback swaps the two
    assert registry_entry(app)["packageVersion"] == "1.1.0"
    assert mgr.record("greet").op == "rollback"
    st = mgr.status()
    assert st.transaction is None and st.packages[0].problems == []
    assert_no_absolute_paths(app)


def test_operator_settings_and_comments_survive_an_upgrade(app, src):
    (app / "tools" / "external.tools.jsonc").write_text(OPERATOR_REGISTRY)
    install(manager(app), src, "1.0.0")
    text = (app / "tools" / "external.tools.jsonc").read_text()
    assert "this comment must survive upgrades" in text
    entry = registry_entry(app)
    assert entry["pool"] == {"min": 1, "max": 3}  # the operator's, not the package default
    assert entry["config"] == {"greeting": "hi"} and entry["env"] == {"GREET_MODE": "loud"}
    assert entry["timeoutMs"] == 10000  # a package default where the operator had none
    assert "upgrade" not in entry  # the manager's state decides it, not the file
    assert entry["packageVersion"] == "1.0.0" and entry["compatibleCore"] == ">=0.1"


@pytest.mark.parametrize(
    ("kwargs", "code", "message"),
    [
        ({"toml": {"checksum": "sha256:" + "9" * 64}}, "checksum-mismatch", "checksum"),
        ({"toml": {"command": "/bin/sh"}}, "invalid-package", "absolute paths are refused"),
        ({"toml": {"args": ["{package}/../x"]}}, "invalid-package", "uses '..'"),
        ({"toml": {"compatibleCore": ">=42"}}, "incompatible", "does not admit toolhost"),
        ({"toml": {"tools": None}}, "invalid-package", "tools: required field missing"),
        ({"link_out": True}, "invalid-package", "symlink leads out of the package"),
        ({"version": "1.1.0"}, "conflict", "greet 1.1.0 is already installed"),
    ],
)
def test_bad_packages_are_refused_and_nothing_changes(app, src, kwargs, code, message):
    mgr = install(manager(app), src, "1.0.0")
    mgr.stage(build(src, "1.1.0"))
    mgr.execute(mgr.prepare_apply("greet"))
    mgr.stage(build(src, "1.2.0"))
    before = tree_state(app)
    link_out = kwargs.pop("link_out", False)
    version = kwargs.pop("version", "2.0.0")
    pkg = build(src / "bad", version, **kwargs)
    if link_out:
        (pkg / "share" / "out").symlink_to("../../../../etc")
    with pytest.raises(PackageError) as info:
        mgr.stage(pkg)
    assert info.value.code == code and message in str(info.value)
    assert tree_state(app) == before


def test_an_entry_the_operator_made_invalid_for_the_new_version_is_refused(app, src):
    mgr = install(manager(app), src, "1.0.0")
    reg = app / "tools" / "external.tools.jsonc"
    doc = json5.loads(reg.read_text())
    doc["sidecars"]["greet"]["sandbox"] = {"greet.version": "approval-required"}
    reg.write_text(json.dumps(doc))
    with pytest.raises(PackageError) as info:
        mgr.stage(build(src, "2.0.0", tools=["greet.other"]))
    assert "sidecars.greet.sandbox.greet.version: not one of this sidecar's tools" in str(
        info.value
    )


def test_refusals_of_apply_and_rollback(app, src):
    mgr = manager(app)
    with pytest.raises(PackageError, match="nothing is staged for greet"):
        mgr.prepare_apply("greet")
    install(mgr, src, "1.0.0")
    with pytest.raises(PackageError) as info:
        mgr.prepare_rollback("greet")
    assert info.value.code == "not-found" and "no previous version" in info.value.message
    with pytest.raises(PackageError, match="not a package id"):
        mgr.prepare_apply("../etc")
    (app / "tools" / "packages" / "other").mkdir()
    with pytest.raises(PackageError) as info:
        mgr.stage(build(src, "1.0.0", pid="other"))
    assert info.value.code == "conflict" and "tools/packages/other exists" in info.value.message
    (app / "tools" / "external.tools.jsonc").write_text("{ broken")
    with pytest.raises(PackageError) as info:
        mgr.stage(build(src, "3.0.0"))
    assert info.value.code == "conflict" and "not valid JSONC" in info.value.message


def test_staging_again_replaces_the_staged_version(app, src):
    mgr = install(manager(app), src, "1.0.0")
    mgr.stage(build(src, "1.1.0"))
    result = mgr.stage(build(src, "1.2.0"))
    assert result.replaced == "1.1.0"
    assert mgr.staged() == {"greet": "greet@1.2.0"}


def test_one_operation_at_a_time(app, src):
    mgr = manager(app)
    other = PackageManager(app)
    with pytest.raises(LockBusy, match="another package operation is in progress"):
        other.lock.acquire()
    mgr.lock.release()
    other.lock.acquire()
    other.lock.release()


def test_recover_removes_leftovers_and_rewrites_next(app, src):
    mgr = install(manager(app), src, "1.0.0")
    mgr.stage(build(src, "1.1.0"))
    (app / "tools/packages/.staging/.incoming-abc").mkdir()
    (app / "tools/packages/..upgrades.json.tmp-123").write_text("x")
    (app / "tools/packages/.trash/dead").mkdir(parents=True)
    (app / "tools/external.tools.jsonc.next").unlink()
    done = mgr.recover()
    assert len(done) == 3 and all("leftover" in d for d in done)
    assert not (app / "tools/packages/.staging/.incoming-abc").exists()
    assert (app / "tools/external.tools.jsonc.next").exists()
    assert mgr.recover() == []


def test_verification_verdicts(app, src):
    mgr = install(manager(app), src, "1.0.0")
    assert mgr.pending_verifications() == ["greet"]
    record, auto = mgr.settle_verification("greet", "failed", "exited before ready")
    assert record.state == "failed" and "no previous version" in record.message  # first install
    mgr.stage(build(src, "1.1.0"))
    mgr.execute(mgr.prepare_apply("greet", auto_rollback=True))
    record, auto = mgr.settle_verification("greet", "failed", "probe: unavailable")
    assert record.state == "rollback-required" and auto
    overlays = mgr.overlays()
    assert overlays["greet"][0] == "rollback-required"
    assert "probe: unavailable" in overlays["greet"][1].message
    assert mgr.settle_verification("greet", "ready", "") == (record, False)  # not verifying


def _journal_cases():
    # (renames really done, what the journal says): a crash may fall between a rename and the
    # journal write that counts it, going forward (done one short) or undoing (one too many).
    for s in range(4):
        yield s, s, False
        if s > 0:
            yield s, s - 1, False
        if s < 3:
            yield s, s + 1, True
        yield s, s, True


@pytest.fixture(scope="module")
def two_versions(tmp_path_factory):
    """An app root with 2.0.0 installed and 1.0.0 previous (built once, copied per test)."""
    base = tmp_path_factory.mktemp("two")
    app, src = base / "app", base / "src"
    (app / "tools").mkdir(parents=True)
    src.mkdir()
    mgr = install(manager(app), src, "1.0.0")
    mgr.stage(build(src, "2.0.0"))
    mgr.execute(mgr.prepare_apply("greet"))
    mgr.lock.release()
    return app


@pytest.mark.parametrize(("real", "claimed", "undoing"), list(_journal_cases()))
def test_undo_is_exact_wherever_the_crash_fell(two_versions, tmp_path, real, claimed, undoing):
    """The rollback plan reuses .previous/<id> as source and destination; recovery still
    restores exactly the state before the transaction from any crash point."""
    from supervisor.packages.fsio import durable_rename
    from supervisor.packages.journal import write_journal

    app = tmp_path / "copy"
    shutil.copytree(two_versions, app, symlinks=True)
    mgr = manager(app)
    before = tree_state(app)
    txn = mgr.prepare_rollback("greet")
    j = txn.journal
    assert len(j.moves) == 3
    for move in j.moves[:real]:
        durable_rename(mgr.base / move.src, mgr.base / move.dst)
    j.done, j.undoing = claimed, undoing
    write_journal(mgr.journal_path, j)
    done = mgr.recover()
    assert f"({real} step(s) reversed)" in done[0]
    assert tree_state(app) == before
    assert installed_version(app) == "2.0.0"
    assert installed_version(app, where=".previous") == "1.0.0"


def test_a_registry_edited_during_apply_undoes_it(app, src):
    mgr = install(manager(app), src, "1.0.0")
    mgr.stage(build(src, "1.1.0"))
    txn = mgr.prepare_apply("greet")
    reg = app / "tools" / "external.tools.jsonc"
    reg.write_text(reg.read_text() + "\n// the operator was here\n")
    edited = tree_state(app)
    with pytest.raises(PackageError) as info:
        mgr.execute(txn)
    assert info.value.code == "conflict" and "was edited during the apply" in info.value.message
    after = tree_state(app)
    nxt = "tools/external.tools.jsonc.next"  # rewritten over the edited registry
    assert set(after) == set(edited)
    assert {k for k in after if after[k] != edited[k]} == {nxt}
    assert "the operator was here" in (app / nxt).read_text()
    assert installed_version(app) == "1.0.0" and mgr.staged() == {"greet": "greet@1.1.0"}
