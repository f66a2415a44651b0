"""``toolhost init``: write a portable ``tools/external.tools.jsonc`` for the bundled sidecars.

The registry is built from the bundled manifests' ``run`` recipes and tool lists; no sidecar code
is imported. Commands are relative or bare PATH names only.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from supervisor.cli.common import EXIT_FAILED, EXIT_OK, app_root
from supervisor.registry.load import REGISTRY_RELPATH
from supervisor.registry.manifests import bundled_manifest_dir, load_manifest_file

HEADER = """// toolhost registry (schemaVersion 2), written by `toolhost init`.
// Commands are portable: relative to their cwd anchor or bare PATH names, never absolute;
// "python" means the interpreter that runs toolhost. See README.md for the format.
"""


def bundled_registry() -> dict[str, Any]:
    """The registry document for every bundled manifest that carries a ``run`` recipe."""
    sidecars: dict[str, Any] = {}
    for path in sorted(bundled_manifest_dir().glob("*.toml")):
        mf, _error = load_manifest_file(path)
        if mf is None or mf.run is None or not mf.sidecar:
            continue
        sidecars[mf.sidecar] = {
            "command": mf.run.command,
            "args": list(mf.run.args),
            "cwd": mf.run.cwd,
            "protocol": "process-json",
            "mode": "persistent",
            "tools": [t.name for t in mf.tool],
            "pool": {"min": 1, "max": 2},
        }
    return {
        "schemaVersion": 2,
        "host": {"socket": ".toolhost/host.sock", "projectDir": ".", "allowDegraded": False},
        "sidecars": sidecars,
    }


def render() -> str:
    return HEADER + json.dumps(bundled_registry(), indent=2) + "\n"


def run(args: argparse.Namespace) -> int:
    text = render()
    if args.stdout:
        sys.stdout.write(text)
        return EXIT_OK
    target = Path(app_root(args)) / REGISTRY_RELPATH
    if target.exists() and not args.force:
        print(f"toolhost: {target} exists; use --force to overwrite it", file=sys.stderr)
        return EXIT_FAILED
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(target.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, target)
    count = len(bundled_registry()["sidecars"])
    print(f"wrote {target} with {count} bundled sidecar(s)")
    return EXIT_OK
