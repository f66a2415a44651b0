"""``toolhost init --add computer`` writes only the display it found (issue 26, item 14): with none,
no ``DISPLAY`` is written and the screen tools are unavailable with the "no display" reason."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.conftest import REPO, running_host, wait_for

MANIFESTS = [str(REPO / "manifests")]


def init_computer(root: Path, display: str | None) -> tuple[dict[str, Any], str]:
    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY")}
    env["XDG_CONFIG_HOME"] = str(root / ".xdg")
    if display is not None:
        env["DISPLAY"] = display
    out = subprocess.run(
        [sys.executable, "-m", "supervisor", "init", "--add", "computer", "--app-root", str(root)],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert out.returncode == 0, out.stderr
    text = (root / "tools" / "external.tools.jsonc").read_text()
    doc = json.loads("\n".join(x for x in text.splitlines() if not x.startswith("//")))
    return doc["sidecars"]["computer.native"], out.stdout


def test_init_writes_the_display_it_found(tmp_path: Path) -> None:
    entry, said = init_computer(tmp_path, ":7")
    assert entry["env"] == {"DISPLAY": ":7"}
    assert "DISPLAY=:7" in said


async def test_init_without_a_display_writes_none_and_the_tools_say_no_display(app: Path) -> None:
    entry, said = init_computer(app, None)
    assert "DISPLAY" not in entry.get("env", {}), entry
    assert "no DISPLAY" in said and "unavailable" in said
    async with running_host(app, manifest_dirs=MANIFESTS) as host:

        def no_display() -> Any:
            found = {}
            for tool in ("screen.screenshot", "computer.window"):
                d = host.catalog.get(tool)
                if d is None or d.stability.probe != "unavailable":
                    return None
                found[tool] = [r.message for r in d.stability.reasons]
            return found

        reasons = await wait_for(host, no_display, what="the screen tools are unavailable")
        for tool, messages in reasons.items():
            assert any("no display" in m for m in messages), (tool, messages)
