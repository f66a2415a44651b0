"""Security first (issue 30): the bundled file tools cannot reach the host's own files.

The red-team reproductions, over the kernel socket, against the real utility sidecar of the
bundled registry, in the worst case (``projectDir: "."``, the app root that holds ``.toolhost/``
and ``tools/``): each is refused ``invalid-input`` with reason ``host-private`` and leaves the
file byte-identical. Then the same through symlinks and archive members, and the default
``projectDir`` (``workspace/``, created at start).
"""

from __future__ import annotations

import io
import json
import os
import shutil
import tarfile
from pathlib import Path
from typing import Any

import msgspec
import pytest

from supervisor.calls.call import InvokeRequest
from tests.conftest import REPO, raw, running_host, wait_available
from tests.kernel import served

UTILITY_TOOLS = ("file.hash", "data.convert", "archive.create", "archive.extract")
SECRET = "hunter2-vault-secret"


def app_with_bundled_tools(
    app: Path, *, project_dir: str | None, confinement: str | None = None
) -> dict[str, bytes]:
    """Copy the bundled ``tools/`` into ``app``, set ``projectDir`` (and ``confinement``),
    plant the host's files."""
    shutil.copytree(REPO / "tools", app / "tools")
    registry = app / "tools" / "external.tools.jsonc"
    text = registry.read_text()
    if project_dir is not None:
        text = text.replace('"projectDir": "workspace"', f'"projectDir": "{project_dir}"')
        assert f'"projectDir": "{project_dir}"' in text
    if confinement is not None:
        text = text.replace('"host": {', f'"host": {{"confinement": "{confinement}",', 1)
    registry.write_text(text)
    state = app / ".toolhost"
    state.mkdir(mode=0o700)
    (state / "operator.token").write_text("the-real-operator-token\n")
    (state / "vault.json").write_text(json.dumps({"API_KEY": SECRET}))
    (state / "audit.jsonl").write_text('{"first": "record"}\n')
    for f in state.iterdir():
        f.chmod(0o600)
    return {str(p.relative_to(app)): p.read_bytes() for p in (*state.iterdir(), registry)}


def unchanged(app: Path, before: dict[str, bytes]) -> None:
    for rel, content in before.items():
        if rel.endswith("audit.jsonl"):  # the host appends records; nothing may replace it
            assert (app / rel).read_bytes().startswith(content), rel
        else:
            assert (app / rel).read_bytes() == content, rel


def refused_private(result: dict[str, Any]) -> None:
    assert result["status"] == "failed", result
    assert result["error"]["code"] == "invalid-input", result
    assert result["error"]["details"]["reason"] == "host-private", result
    assert SECRET not in json.dumps(result)


ATTACKS = [
    # 1. overwrite the operator token, then approve with it
    {
        "text": '"PWNED"',
        "from": "json",
        "to": "json",
        "output": ".toolhost/operator.token",
        "overwrite": True,
    },
    # 2. read the vault
    {"input": ".toolhost/vault.json", "from": "json", "to": "json"},
    # 3. wipe the audit log
    {
        "text": "{}",
        "from": "json",
        "to": "json",
        "output": ".toolhost/audit.jsonl",
        "overwrite": True,
    },
    # 4. write a registry that runs a command
    {
        "text": json.dumps({"schemaVersion": 2, "sidecars": {"x": {"command": "sh"}}}),
        "from": "json",
        "to": "json",
        "output": "tools/external.tools.jsonc",
        "overwrite": True,
    },
]


async def test_the_four_attacks_are_refused_over_the_kernel_socket(app):
    before = app_with_bundled_tools(app, project_dir=".")
    async with running_host(app, manifest_dirs=[str(REPO / "manifests")]) as host:
        await wait_available(host, *UTILITY_TOOLS, timeout=30)
        async with served(host, app) as srv, srv.peer("unix-json") as kernel:
            for i, attack in enumerate(ATTACKS):
                got = await kernel.request(
                    i, "tools.invoke", {"tool": "data.convert", "input": attack}
                )
                refused_private(got["result"])
            # file.hash and archive.create name the files directly: refused too
            for i, path in enumerate((".toolhost/vault.json", "tools/external.tools.jsonc")):
                got = await kernel.request(
                    10 + i, "tools.invoke", {"tool": "file.hash", "input": {"path": path}}
                )
                refused_private(got["result"])
            got = await kernel.request(
                20,
                "tools.invoke",
                {"tool": "archive.create", "input": {"source": ".toolhost", "output": "s.zip"}},
            )
            refused_private(got["result"])
            assert not (app / "s.zip").exists()
    unchanged(app, before)


async def test_symlinks_and_archive_members_into_host_files_are_refused(app):
    before = app_with_bundled_tools(app, project_dir=".", confinement="best-effort")
    (app / "innocent.json").symlink_to(".toolhost/vault.json")
    (app / "state").symlink_to(".toolhost")
    (app / "dangling").symlink_to(".toolhost/new-file")
    evil = io.BytesIO()
    with tarfile.open(fileobj=evil, mode="w") as tf:
        data = b"PWNED\n"
        info = tarfile.TarInfo(".toolhost/operator.token")
        info.size = len(data)
        tf.addfile(info, io.BytesIO(data))
    (app / "evil.tar").write_bytes(evil.getvalue())
    (app / "docs").mkdir()
    (app / "docs" / "a.txt").write_text("a\n")
    async with running_host(app, manifest_dirs=[str(REPO / "manifests")]) as host:
        await wait_available(host, *UTILITY_TOOLS, timeout=30)

        async def call(tool: str, args: dict[str, Any]) -> dict[str, Any]:
            env = await host.invoker.invoke(InvokeRequest(tool, raw(args)))
            return msgspec.json.decode(msgspec.json.encode(env))

        refused_private(await call("file.hash", {"path": "innocent.json"}))
        refused_private(await call("file.hash", {"path": "state/vault.json"}))
        refused_private(
            await call(
                "data.convert",
                {"text": "1", "from": "json", "to": "json", "output": "dangling"},
            )
        )
        assert not (app / ".toolhost" / "new-file").exists()
        refused = await call("archive.extract", {"archive": "evil.tar", "destination": "."})
        refused_private(refused)
        assert refused["error"]["details"]["member"] == ".toolhost/operator.token"
        # What an operator with projectDir "." gets confined (docs/confinement.md, known
        # limits): the top is listed (so "." can be archived), but nothing new can be made at
        # the top (only in the folders there at load); the failure names the fix.
        top = await call("archive.create", {"source": ".", "output": "all.tar"})
        assert top["status"] == "failed", top
        assert "nothing can be made there" in top["content"], top
        assert 'set host.projectDir to a folder of its own (e.g. "workspace")' in top["content"]
        assert not (app / "all.tar").exists()
        # archiving the whole project leaves the host's files out, and says so
        made = await call("archive.create", {"source": ".", "output": "docs/all.tar"})
        assert made["status"] == "success", made
        skipped = {s["path"]: s["reason"] for s in made["data"]["skipped"]}
        assert skipped[".toolhost"] == "host-private" and skipped["tools"] == "host-private"
        with tarfile.open(app / "docs" / "all.tar") as tf:
            names = tf.getnames()
        assert "docs/a.txt" in names
        assert not [n for n in names if n.startswith((".toolhost", "tools"))], names
    unchanged(app, before)


async def test_default_project_dir_is_a_workspace_created_at_start(app):
    app_with_bundled_tools(app, project_dir=None)
    assert not (app / "workspace").exists()
    async with running_host(app, manifest_dirs=[str(REPO / "manifests")]) as host:
        assert (app / "workspace").is_dir()
        assert host.registry.project_dir == str(app / "workspace")
        await wait_available(host, "file.hash", timeout=30)
        (app / "workspace" / "w.txt").write_text("w\n")
        env = await host.invoker.invoke(InvokeRequest("file.hash", raw({"path": "w.txt"})))
        assert env.status == "success"
        # the host's files are not in the workspace at all: reaching them means leaving it
        env = await host.invoker.invoke(
            InvokeRequest("file.hash", raw({"path": "../.toolhost/vault.json"}))
        )
        assert env.status != "success" and env.error is not None
        assert env.error.details is not None
        assert env.error.details["reason"] == "parent-traversal"


@pytest.mark.parametrize("target", [".toolhost", "tools"])
async def test_a_project_dir_inside_the_host_files_exposes_nothing(app, target):
    app_with_bundled_tools(app, project_dir=target)
    async with running_host(app, manifest_dirs=[str(REPO / "manifests")]) as host:
        await wait_available(host, "file.hash", timeout=30)
        name = "vault.json" if target == ".toolhost" else "external.tools.jsonc"
        env = await host.invoker.invoke(InvokeRequest("file.hash", raw({"path": name})))
        assert env.error is not None and env.error.details is not None
        assert env.error.details["reason"] == "host-private"


def test_private_roots_hold_both_names_of_a_symlinked_state_folder(tmp_path):
    from supervisor.policy.host_private import private_match, private_roots

    real = tmp_path / "elsewhere"
    real.mkdir()
    app = tmp_path / "app"
    app.mkdir()
    os.symlink(real, app / ".toolhost")
    roots = private_roots(app_root=str(app))
    assert private_match(str(app / ".toolhost" / "vault.json"), roots)
    assert private_match(str(real / "vault.json"), roots)
    assert private_match(str(app / "toolsx"), roots) is None
    assert private_match(str(app / "README.md"), roots) is None


def test_the_installation_is_private_in_a_source_checkout():
    from supervisor.host.loading import install_dirs

    dirs = install_dirs()
    for name in ("supervisor", "sidecars", "Makefile", "pyproject.toml", ".ci", ".git"):
        assert str(REPO / name) in dirs, name
