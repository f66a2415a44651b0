"""``toolhost init --add web|media`` and ``tools/init.sh web``: engines checked for media."""

import json
import os
import shutil
import subprocess
import sys

from tests.conftest import REPO
from tests.e2e.conftest import cli


def _doc(root):
    text = (root / "tools" / "external.tools.jsonc").read_text()
    return json.loads("\n".join(line for line in text.splitlines() if not line.startswith("//")))


def test_plain_init_is_utility_only_and_add_appends_families(tmp_path):
    root = tmp_path / "app"
    root.mkdir()
    assert cli(root, "init").returncode == 0
    assert set(_doc(root)["sidecars"]) == {"utility"}
    out = cli(root, "init", "--add", "web", "--add", "media")
    assert out.returncode == 0, out.stderr
    doc = _doc(root)
    assert set(doc["sidecars"]) == {"utility", "web", "media"}
    assert doc["sidecars"]["web"]["args"] == ["-m", "sidecars.web"]
    assert str(tmp_path) not in (root / "tools" / "external.tools.jsonc").read_text()
    delegates = doc["sidecars"]["media"]["config"]["localCommands"]
    # Registered exactly for the engines found here; each skipped one is reported with a hint.
    assert ("vision.ocr" in delegates) == (shutil.which("tesseract") is not None)
    for entry in delegates.values():
        assert entry["command"] == "python" and entry["args"][1].startswith("sidecars.media.")
    if "vision.ocr" not in delegates:
        assert "install: Debian package tesseract-ocr" in out.stdout
    again = cli(root, "init", "--add", "web")
    assert again.returncode == 1 and "--force" in again.stderr
    bad = cli(root, "init", "--add", "nope")
    assert bad.returncode == 1 and "unknown family nope" in bad.stderr


def test_init_sh_adds_a_family(tmp_path):
    root = tmp_path / "app"
    (root / "tools").mkdir(parents=True)
    shutil.copy(REPO / "tools" / "init.sh", root / "tools" / "init.sh")
    out = subprocess.run(
        ["sh", str(root / "tools" / "init.sh"), "web", "--stdout"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PATH": f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}"},
    )
    assert out.returncode == 0, out.stderr
    body = "\n".join(line for line in out.stdout.splitlines() if not line.startswith("//"))
    assert set(json.loads(body)["sidecars"]) == {"utility", "web"}
    assert "web.search stays unavailable" in out.stderr
