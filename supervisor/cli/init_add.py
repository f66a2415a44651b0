"""What ``toolhost init --add web|media`` writes beyond the manifest's ``run`` recipe.

The ``web`` and ``media`` families are opt-in (``init.OPT_IN``) because they need packages or
engines the user installs. Nothing is imported from the family's code and nothing is installed:
for ``media`` the bundled delegates are registered only for engines found on this machine (on
PATH, or the Python package importable), and the skipped ones are reported with what to install.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from typing import Any, TextIO

from supervisor.policy.paths import host_path

# tool -> (delegate module, engine probe (kind, name), what to install)
MEDIA_DELEGATES: dict[str, tuple[str, tuple[str, str], str]] = {
    "vision.ocr": ("ocr", ("binary", "tesseract"), "Debian package tesseract-ocr"),
    "audio.speak": ("speak", ("binary", "espeak-ng"), "Debian package espeak-ng"),
    "audio.transcribe": ("transcribe", ("module", "pocketsphinx"), "pip install pocketsphinx"),
    "vision.analyze": ("analyze", ("module", "PIL"), "pip install Pillow"),
}


def sys_path() -> str:
    """The PATH the host will resolve commands with (its interpreter's folder first), so what
    init finds is what the host finds, whatever shell runs init."""
    return host_path(os.environ.get("PATH"), sys.executable)


def _engine_found(kind: str, name: str) -> bool:
    if kind == "binary":
        return shutil.which(name, path=sys_path()) is not None
    return importlib.util.find_spec(name) is not None


def family_config(family: str) -> tuple[dict[str, Any], list[str]]:
    """The ``config`` for a family's registry entry and notes for the user.

    Returns:
        The config object and human lines (registered / skipped delegates, hints).
    """
    if family == "media":
        commands: dict[str, Any] = {}
        notes: list[str] = []
        for tool, (module, (kind, name), install) in MEDIA_DELEGATES.items():
            if _engine_found(kind, name):
                commands[tool] = {
                    "command": "python",
                    "args": ["-m", f"sidecars.media.delegates.{module}"],
                }
                notes.append(f"media: {tool} -> bundled delegate ({name} found)")
            else:
                notes.append(f"media: skipped {tool}: {name} not found; install: {install}")
        return {"localCommands": commands}, notes
    if family == "web":
        return {}, [
            "web: web.search stays unavailable until config.providers is set "
            "(see docs/sidecars/web.md)"
        ]
    return {}, []


def print_notes(families: list[str], out: TextIO) -> None:
    """Tell the user what ``--add`` registered and what it skipped (and what to install)."""
    for family in families:
        for line in family_config(family)[1]:
            print(line, file=out)
