"""The host's own interpreter folder comes first on the PATH it resolves bare names with and
hands to sidecars, whatever shell started it (issue 26, item 10: `make serve` runs
``.venv/bin/toolhost`` from a shell whose PATH lacks ``.venv/bin``)."""

from __future__ import annotations

import json
import os
import shutil
import site
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import trio

from supervisor.client import open_client
from tests.e2e.conftest import TOOLHOST, serve

VENV_BIN = os.path.dirname(os.path.abspath(sys.executable))
# A PATH without the venv: what `make serve` or a systemd unit gives the host.
BARE_PATH = os.pathsep.join(
    p for p in os.environ.get("PATH", os.defpath).split(os.pathsep) if p != VENV_BIN
)

pytestmark = pytest.mark.skipif(
    not (Path(VENV_BIN) / "pylsp").exists() or not (Path(VENV_BIN) / "mcp-server-time").exists(),
    reason="needs pylsp and mcp-server-time installed next to the test interpreter (make test)",
)


def _registry(root: Path) -> None:
    (root / "tools").mkdir(parents=True)
    doc = {
        "schemaVersion": 2,
        "sidecars": {
            # A bare name the host resolves itself...
            "time": {
                "command": "mcp-server-time",
                "args": ["--local-timezone", "UTC"],
                "protocol": "mcp",
            },
            # ...and one the sidecar resolves with the PATH the host handed it.
            "utility": {
                "command": "python",
                "args": ["-m", "sidecars.utility"],
                "tools": ["lsp.symbols"],
                "config": {"lspCommand": ["pylsp"]},
            },
        },
    }
    (root / "tools" / "external.tools.jsonc").write_text(json.dumps(doc))


def test_venv_commands_are_found_without_the_venv_on_path(tmp_path):
    assert shutil.which("pylsp", path=BARE_PATH) is None, "the test needs pylsp only in the venv"
    assert shutil.which("mcp-server-time", path=BARE_PATH) is None
    root = tmp_path / "app"
    _registry(root)
    env = {**os.environ, "PATH": BARE_PATH, "XDG_CONFIG_HOME": str(root / ".xdg")}
    doctor = subprocess.run(
        [*TOOLHOST, "doctor", "--json", "--timeout", "30", "--app-root", str(root)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    report = json.loads(doctor.stdout)
    tools = {t["name"]: t["effective"] for t in report["tools"]}
    problems = [p for s in report["sidecars"] for p in s["problems"]]
    assert tools.get("get_current_time") == "available", (tools, problems)
    assert tools["lsp.symbols"] == "available", (tools, problems)
    # serve, started from the same shell, agrees (and the MCP server it found answers).
    with serve(root, env={"PATH": BARE_PATH}):
        effective, answer = trio.run(_watch, str(root / ".toolhost" / "host.sock"))
    assert effective["get_current_time"] == "available", effective
    assert effective["lsp.symbols"] == "available", effective
    assert answer.status == "success", answer


async def _watch(sock: str) -> tuple[dict[str, str], Any]:
    """The verdicts once both tools have one that is not ``starting``, and a real call."""
    async with open_client(sock) as client:
        mirror = await client.mirror_catalog()
        with trio.fail_after(60):
            while True:
                effective = {d.name: d.stability for d in mirror.descriptors()}
                wanted = [effective.get(n) for n in ("get_current_time", "lsp.symbols")]
                if all(s is not None and s.runtime != "starting" for s in wanted):
                    break
                await mirror.wait_revision(mirror.revision + 1)
        answer = await client.invoke("get_current_time", {"timezone": "UTC"})
    return {n: s.effective for n, s in effective.items()}, answer


def test_init_looks_for_delegates_where_the_host_will(tmp_path):
    """`toolhost init --add computer` finds xdotool on the PATH the host will use (its
    interpreter's folder first), not only on the shell's."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "python").symlink_to(sys.executable)
    fake = bindir / "xdotool"
    fake.write_text("#!/bin/sh\nexit 0\n")
    fake.chmod(0o755)
    root = tmp_path / "app"
    root.mkdir()
    argv = ["-m", "supervisor", "init", "--add", "computer", "--app-root", str(root)]
    done = subprocess.run(
        [str(bindir / "python"), *argv],
        capture_output=True,
        text=True,
        timeout=60,
        env={
            **os.environ,
            "PATH": "/nonexistent",
            # the symlink is not a venv: hand it the packages this interpreter has
            "PYTHONPATH": os.pathsep.join(
                [str(Path(__file__).resolve().parents[2]), *site.getsitepackages()]
            ),
            "XDG_CONFIG_HOME": str(tmp_path / ".xdg"),
        },
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout + done.stderr
    assert "enabled the control tools" in out, out
    assert "xdotool was not found" not in out
