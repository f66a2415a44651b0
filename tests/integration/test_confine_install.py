"""The installation every confined worker reads (``processes.confine.install_paths``) holds the
bundled ``sidecars`` package however the host was started: from a folder outside the repository,
with an editable install whose meta path finder (not a ``sys.path`` entry) finds the package.
A host started by ``toolhost serve`` from any folder once left it out, and every worker
importing the SDK died on ``PermissionError``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

PROBE = """
import importlib, json
from supervisor.processes.confine import install_paths
found = importlib.import_module("sidecars").__path__[0]
print(json.dumps({"paths": install_paths(), "sidecars": found}))
"""


def test_the_sidecars_package_is_granted_from_outside_the_repository(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run(
        [sys.executable, "-P", "-c", PROBE],  # -P: the current folder is not on sys.path
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    got = json.loads(out.stdout)
    found = os.path.realpath(got["sidecars"])
    assert any(found == p or found.startswith(p.rstrip("/") + "/") for p in got["paths"]), got
