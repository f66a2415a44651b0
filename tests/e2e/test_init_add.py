"""``toolhost init --add browser`` and ``tools/init.sh browser``: opt-in families are written
with portable commands, the endpoint in ``config`` and ``browser.evaluate`` approval-required."""

import json
import os
import shutil
import subprocess
import sys

from tests.conftest import REPO
from tests.e2e.conftest import cli


def registry(root):
    text = (root / "tools" / "external.tools.jsonc").read_text()
    return text, json.loads("\n".join(x for x in text.splitlines() if not x.startswith("//")))


def check_browser_entry(entry):
    assert entry["command"] == "python" and entry["args"] == ["-m", "sidecars.browser_cdp"]
    assert entry["cwd"] == "app"
    assert entry["config"] == {"endpoint": "http://127.0.0.1:9222"}
    assert entry["sandbox"] == {"browser.evaluate": "approval-required"}
    assert entry["pool"]["max"] == 1
    assert set(entry["tools"]) == {
        "browser.open",
        "browser.navigate",
        "browser.snapshot",
        "browser.screenshot",
        "browser.click",
        "browser.type",
        "browser.evaluate",
    }


def test_plain_init_leaves_the_browser_out_and_add_puts_it_in(tmp_path):
    root = tmp_path / "app"
    root.mkdir()
    assert cli(root, "init").returncode == 0
    _, doc = registry(root)
    assert set(doc["sidecars"]) == {"utility"}

    out = cli(root, "init", "--add", "browser")
    assert out.returncode == 0, out.stderr
    text, doc = registry(root)
    assert set(doc["sidecars"]) == {"utility", "browser"}
    assert str(tmp_path) not in text
    check_browser_entry(doc["sidecars"]["browser"])

    again = cli(root, "init", "--add", "browser")
    assert again.returncode == 1 and "--force" in again.stderr
    assert cli(root, "init", "--add", "browser", "--force").returncode == 0

    unknown = cli(root, "init", "--add", "teleporter")
    assert unknown.returncode == 1 and "unknown family teleporter" in unknown.stderr
    assert "browser" in unknown.stderr


def test_init_script_takes_family_names(tmp_path):
    root = tmp_path / "app"
    (root / "tools").mkdir(parents=True)
    shutil.copy(REPO / "tools" / "init.sh", root / "tools" / "init.sh")
    env = {**os.environ, "PATH": f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}"}
    env["XDG_CONFIG_HOME"] = str(root / ".xdg")
    out = subprocess.run(
        ["sh", str(root / "tools" / "init.sh"), "browser", "--stdout"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    doc = json.loads("\n".join(x for x in out.stdout.splitlines() if not x.startswith("//")))
    assert set(doc["sidecars"]) == {"utility", "browser"}
    check_browser_entry(doc["sidecars"]["browser"])
    out = subprocess.run(
        ["sh", str(root / "tools" / "init.sh"), "browser"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    _, doc = registry(root)
    check_browser_entry(doc["sidecars"]["browser"])
