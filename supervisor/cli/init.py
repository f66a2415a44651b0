"""``toolhost init``: write a portable ``tools/external.tools.jsonc`` for the bundled sidecars.

The registry is built from the bundled manifests' ``run`` recipes and tool lists; no sidecar code
is imported. Commands are relative or bare PATH names only.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from supervisor.cli.common import EXIT_FAILED, EXIT_OK, app_root
from supervisor.cli.init_add import family_config, print_notes, sys_path
from supervisor.registry.load import REGISTRY_RELPATH, jsonc_error
from supervisor.registry.manifests import bundled_manifest_dir, load_manifest_file

HEADER = """// toolhost registry (schemaVersion 2), written by `toolhost init`.
// Commands are portable: relative to their cwd anchor or bare PATH names, never absolute;
// "python" means the interpreter that runs toolhost. See README.md for the format.
"""


# Families registered only on request (`toolhost init --add <family>`, `tools/init.sh <family>`),
# because they need something outside toolhost (a browser...). Keyed by manifest file stem; the
# value is merged into the registry entry built from the manifest's ``run`` recipe.
OPT_IN: dict[str, dict[str, Any]] = {
    "browser": {
        "config": {"endpoint": "http://127.0.0.1:9222"},
        "sandbox": {"browser.evaluate": "approval-required"},
        # One worker owns the browser connection and "the tab opened last".
        "pool": {"min": 1, "max": 1},
    },
    # Their config is built by ``init_add.family_config`` (media: the delegates whose engines
    # are found on this machine).
    "web": {},
    "media": {},
    # computer.native: one worker (control actions are serialised in it). The display (passed
    # explicitly: the host gives sidecars no DISPLAY) and the delegates: see computer_setup.
    "computer": {"pool": {"min": 1, "max": 1}},
    # computer.use: the facade over computer.native (every step a host call).
    "computer_use": {"pool": {"min": 1, "max": 1}},
}

# The bundled xdotool delegate of computer.mouse / computer.keyboard (sidecars/computer/xdo.py),
# as argument templates with a PATH/python command only.
XDO_MOUSE = ["python", "-m", "sidecars.computer.xdo", "mouse", "{action}", "{x}", "{y}"]
XDO_MOUSE += ["{button}", "{toX}", "{toY}", "{direction}", "{amount}"]
XDO_KEYBOARD = ["python", "-m", "sidecars.computer.xdo", "keyboard", "{action}", "{text}", "{keys}"]


def computer_setup(entry: dict[str, Any]) -> str:
    """The display and the delegates of ``entry``: each written only when found here."""
    return computer_display(entry) + "\n" + computer_delegates(entry)


def computer_display(entry: dict[str, Any]) -> str:
    """Pass this session's ``DISPLAY`` to ``entry``; with none, write none (never a guess): the
    screen tools are then unavailable with the "no display" reason until one is set."""
    display = os.environ.get("DISPLAY")
    if display:
        entry["env"] = {"DISPLAY": display}
        return f"computer: the sidecar uses this session's display DISPLAY={display}"
    return (
        "computer: no DISPLAY in this session, so none was written: screen.screenshot and "
        "computer.window stay unavailable (no display) until the entry's env.DISPLAY (e.g. "
        '":0") or config.display names a running X server'
    )


def computer_delegates(entry: dict[str, Any]) -> str:
    """Enable the xdotool delegate in ``entry`` only when xdotool is found; say what was done."""
    if shutil.which("xdotool", path=sys_path()) is None:
        return (
            "computer: xdotool was not found on PATH, so computer.mouse and computer.keyboard stay "
            "unavailable (apt install xdotool, then `toolhost init --add computer --force`)"
        )
    entry["config"] = {"mouseCommand": XDO_MOUSE, "keyboardCommand": XDO_KEYBOARD}
    return (
        "computer: enabled the control tools computer.mouse and computer.keyboard through the "
        "bundled xdotool delegate; they ask for approval on every call (sandbox approval-required)"
    )


# Per-family steps that depend on this machine; each returns a line to print.
OPT_IN_CHECKS: dict[str, Callable[[dict[str, Any]], str]] = {"computer": computer_setup}
NOTES: dict[str, str] = {}
"""What the last :func:`bundled_families` found per family (printed for the families added)."""


def _print_notes(add: list[str]) -> None:
    for family in add:
        if family in NOTES:
            print(NOTES[family])


def bundled_families() -> dict[str, tuple[str, dict[str, Any]]]:
    """Every bundled manifest with a ``run`` recipe: family -> (sidecar id, registry entry)."""
    families: dict[str, tuple[str, dict[str, Any]]] = {}
    for path in sorted(bundled_manifest_dir().glob("*.toml")):
        mf, _error = load_manifest_file(path)
        if mf is None or mf.run is None or not mf.sidecar:
            continue
        entry: dict[str, Any] = {
            "command": mf.run.command,
            "args": list(mf.run.args),
            "cwd": mf.run.cwd,
            "protocol": "process-json",
            "mode": "persistent",
            "tools": [t.name for t in mf.tool],
            "pool": {"min": 1, "max": 2},
        }
        entry.update(OPT_IN.get(path.stem, {}))
        config, _notes = family_config(path.stem)
        if config:
            entry["config"] = config
        if path.stem in OPT_IN_CHECKS:
            NOTES[path.stem] = OPT_IN_CHECKS[path.stem](entry)
        families[path.stem] = (mf.sidecar, entry)
    return families


def bundled_registry(add: list[str] | None = None) -> dict[str, Any]:
    """The registry document: the default bundled sidecars plus the opt-in families ``add``.

    Raises:
        ValueError: A family in ``add`` is not bundled.
    """
    families = bundled_families()
    unknown = [f for f in add or [] if f not in families]
    if unknown:
        known = ", ".join(sorted(families))
        raise ValueError(f"unknown family {', '.join(unknown)} (bundled: {known})")
    wanted = [f for f in families if f not in OPT_IN or f in (add or [])]
    return {
        "schemaVersion": 2,
        "host": {
            "socket": ".toolhost/host.sock",
            "projectDir": "workspace",
            "allowDegraded": False,
        },
        "sidecars": dict(families[f] for f in wanted),
    }


def render(add: list[str] | None = None) -> str:
    return HEADER + json.dumps(bundled_registry(add), indent=2) + "\n"


def _write(target: Path, text: str) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(target.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, target)


def _add_to_existing(target: Path, add: list[str], force: bool) -> int:
    """Add the ``add`` families' entries to an existing registry (comments are not kept)."""
    import json5

    try:
        doc = json5.loads(target.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        why = jsonc_error(exc, str(target)) if isinstance(exc, ValueError) else f"{target}: {exc}"
        print(f"toolhost: cannot read {why}", file=sys.stderr)
        return EXIT_FAILED
    if not isinstance(doc, dict) or not isinstance(doc.get("sidecars", {}), dict):
        print(f"toolhost: {target} has no sidecars object", file=sys.stderr)
        return EXIT_FAILED
    families = bundled_families()
    sidecars = doc.setdefault("sidecars", {})
    for family in add:
        sidecar_id, entry = families[family]
        if sidecar_id in sidecars and not force:
            print(
                f"toolhost: {target} already has sidecar {sidecar_id!r}; use --force to replace it",
                file=sys.stderr,
            )
            return EXIT_FAILED
        sidecars[sidecar_id] = entry
    _write(target, HEADER + json.dumps(doc, indent=2) + "\n")
    print(f"added {', '.join(add)} to {target}")
    return EXIT_OK


def run(args: argparse.Namespace) -> int:
    add: list[str] = list(dict.fromkeys(getattr(args, "add", None) or []))
    try:
        text = render(add)
    except ValueError as exc:
        print(f"toolhost: {exc}", file=sys.stderr)
        return EXIT_FAILED
    print_notes(add, sys.stderr if args.stdout else sys.stdout)
    if args.stdout:
        sys.stdout.write(text)
        return EXIT_OK
    target = Path(app_root(args)) / REGISTRY_RELPATH
    if target.exists() and add:
        code = _add_to_existing(target, add, args.force)
        if code == EXIT_OK:
            _print_notes(add)
        return code
    if target.exists() and not args.force:
        print(f"toolhost: {target} exists; use --force to overwrite it", file=sys.stderr)
        return EXIT_FAILED
    _write(target, text)
    count = len(bundled_registry(add)["sidecars"])
    print(f"wrote {target} with {count} bundled sidecar(s)")
    _print_notes(add)
    return EXIT_OK
