"""``toolhost init --add computer`` writes the xdotool delegate only when xdotool is on PATH, and
says that it enabled the control tools and that they ask for approval."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.conftest import TOOLHOST


def init_add(root: Path, path: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*TOOLHOST, "init", "--app-root", str(root), "--add", "computer"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PATH": path, "XDG_CONFIG_HOME": str(root / ".xdg")},
    )


def entry(root: Path) -> dict:
    text = (root / "tools" / "external.tools.jsonc").read_text()
    doc = json.loads("\n".join(x for x in text.splitlines() if not x.startswith("//")))
    assert set(doc["sidecars"]) == {"utility", "computer.native"}
    return doc["sidecars"]["computer.native"]


def test_init_add_computer_with_xdotool(tmp_path: Path) -> None:
    if shutil.which("xdotool") is None:
        if os.environ.get("CI") == "true":
            pytest.fail("CI must install xdotool")
        pytest.skip("xdotool is not installed (apt-get install -y xdotool)")
    root = tmp_path / "app"
    root.mkdir()
    out = init_add(root, os.environ["PATH"])
    assert out.returncode == 0, out.stderr
    assert "enabled the control tools computer.mouse and computer.keyboard" in out.stdout
    assert "ask for approval" in out.stdout
    got = entry(root)
    assert got["command"] == "python" and got["args"] == ["-m", "sidecars.computer"]
    assert got["config"]["mouseCommand"][:3] == ["python", "-m", "sidecars.computer.xdo"]
    assert got["config"]["keyboardCommand"][:4] == [
        "python",
        "-m",
        "sidecars.computer.xdo",
        "keyboard",
    ]
    assert str(tmp_path) not in json.dumps(got)


def test_init_add_computer_without_xdotool(tmp_path: Path) -> None:
    root = tmp_path / "app"
    root.mkdir()
    empty = tmp_path / "empty-path"
    empty.mkdir()
    out = init_add(root, str(empty))
    assert out.returncode == 0, out.stderr
    assert "xdotool was not found" in out.stdout and "enabled" not in out.stdout
    assert "config" not in entry(root)
    assert sys.executable  # the CLI ran with an absolute interpreter, PATH was only for xdotool
