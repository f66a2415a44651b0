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
from supervisor.cli.init_add import DEFAULT_FAMILIES, family_config
from supervisor.registry.load import REGISTRY_RELPATH
from supervisor.registry.manifests import bundled_manifest_dir, load_manifest_file

HEADER = """// toolhost registry (schemaVersion 2), written by `toolhost init`.
// Commands are portable: relative to their cwd anchor or bare PATH names, never absolute;
// "python" means the interpreter that runs toolhost. See README.md for the format.
"""


def bundled_entries() -> dict[str, dict[str, Any]]:
    """Registry entries of every bundled manifest with a ``run`` recipe, by family file stem."""
    entries: dict[str, dict[str, Any]] = {}
    for path in sorted(bundled_manifest_dir().glob("*.toml")):
        mf, _error = load_manifest_file(path)
        if mf is None or mf.run is None or not mf.sidecar:
            continue
        entries[path.stem] = {
            "id": mf.sidecar,
            "command": mf.run.command,
            "args": list(mf.run.args),
            "cwd": mf.run.cwd,
            "protocol": "process-json",
            "mode": "persistent",
            "tools": [t.name for t in mf.tool],
            "pool": {"min": 1, "max": 2},
        }
    return entries


def bundled_registry() -> dict[str, Any]:
    """The registry document for the default bundled families (``init_add.DEFAULT_FAMILIES``)."""
    sidecars: dict[str, Any] = {}
    for family, entry in bundled_entries().items():
        if family in DEFAULT_FAMILIES:
            entry = dict(entry)
            sidecars[entry.pop("id")] = entry
    return {
        "schemaVersion": 2,
        "host": {"socket": ".toolhost/host.sock", "projectDir": ".", "allowDegraded": False},
        "sidecars": sidecars,
    }


def render() -> str:
    return HEADER + json.dumps(bundled_registry(), indent=2) + "\n"


def add_families(args: argparse.Namespace) -> int:
    """``--add FAMILY``: merge that family's entry into the registry (created when absent)."""
    import json5

    entries = bundled_entries()
    target = Path(app_root(args)) / REGISTRY_RELPATH
    exists = target.exists()
    doc = json5.loads(target.read_text(encoding="utf-8")) if exists else bundled_registry()
    for family in args.add:
        if family not in entries:
            known = ", ".join(sorted(entries))
            print(f"toolhost: no bundled family {family!r} (known: {known})", file=sys.stderr)
            return EXIT_FAILED
        entry = dict(entries[family])
        sidecar_id = entry.pop("id")
        if sidecar_id in doc.get("sidecars", {}) and not args.force:
            print(
                f"toolhost: sidecar {sidecar_id!r} is already registered; use --force",
                file=sys.stderr,
            )
            return EXIT_FAILED
        config, notes = family_config(family)
        if config:
            entry["config"] = config
        doc.setdefault("sidecars", {})[sidecar_id] = entry
        for line in notes:
            print(line)
    text = HEADER + json.dumps(doc, indent=2) + "\n"
    if args.stdout:
        sys.stdout.write(text)
        return EXIT_OK
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(target.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, target)
    print(f"wrote {target} with {', '.join(args.add)} added")
    return EXIT_OK


def run(args: argparse.Namespace) -> int:
    if getattr(args, "add", None):
        return add_families(args)
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
