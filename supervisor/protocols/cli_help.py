"""A CLI tool's input schema read from its ``--help`` (PROTOCOL 3.3), as a pure function.

# Strategy: argparse and GNU-style help share a shape: a ``usage:`` line, an optional description
# paragraph, then option lines (``  -x, --flag-name METAVAR   help text``) whose help may
# continue on deeper-indented lines. The usage line tells which flags are required (those not
# inside ``[...]``); an option without a metavar is a boolean (``store_true``); a metavar in
# braces (``{red,blue}``) is an ``enum``. Flags become properties with ``-`` turned back into
# ``_``, so the host's flag mapping (``_`` -> ``-``) gives the script exactly its own flags.
# Anything that does not look like such help gives None: the script is then not a CLI tool.
"""

from __future__ import annotations

import re
from typing import Any

USAGE = re.compile(r"^\s*usage:\s*(.*)$", re.IGNORECASE)
OPTION = re.compile(
    r"^\s{1,12}(?:-\w(?:[ =](?:\{[^}]*\}|[A-Za-z_<][\w<>-]*))?,\s*)?(--[A-Za-z0-9][\w-]*)"
    r"(?:[ =](\{[^}]*\}|[A-Za-z_<][\w<>-]*))?(?:\s{2,}(\S.*))?$"
)
HEADER = re.compile(r"^\S.*:\s*$")
SKIP = {"help", "version"}


def _usage_flags(usage: str) -> set[str]:
    """Flags written outside ``[...]`` in the usage text (the required ones)."""
    depth = 0
    current: list[str] = []
    words: list[str] = []
    for ch in usage:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth = max(0, depth - 1)
        elif depth == 0:
            current.append(ch)
            continue
        words.append("".join(current))
        current = []
    words.append("".join(current))
    flags: set[str] = set()
    for chunk in words:
        for word in chunk.split():
            if word.startswith("--"):
                flags.add(word.split("=", 1)[0])
    return flags


def schema_from_help(text: str) -> tuple[str, dict[str, Any]] | None:
    """``(description, JSON Schema)`` from a ``--help`` text, or None if it is not CLI help."""
    lines = text.splitlines()
    usage_at = next((i for i, line in enumerate(lines) if USAGE.match(line)), None)
    if usage_at is None:
        return None
    usage_parts = [USAGE.match(lines[usage_at]).group(1)]  # type: ignore[union-attr]
    i = usage_at + 1
    while i < len(lines) and lines[i].startswith(" ") and lines[i].strip():
        usage_parts.append(lines[i].strip())
        i += 1
    required_flags = _usage_flags(" ".join(usage_parts))
    description: list[str] = []
    properties: dict[str, Any] = {}
    required: list[str] = []
    last: dict[str, Any] | None = None
    in_options = False
    for line in lines[i:]:
        if not line.strip():
            last = None if in_options else last
            continue
        match = OPTION.match(line)
        if match:
            in_options = True
            flag, metavar, help_text = match.groups()
            key = flag[2:].replace("-", "_")
            if key in SKIP:
                last = None
                continue
            prop: dict[str, Any]
            if metavar is None:
                prop = {"type": "boolean"}
            elif metavar.startswith("{"):
                prop = {"type": "string", "enum": [c.strip() for c in metavar[1:-1].split(",")]}
            else:
                prop = {"type": "string"}
            if help_text:
                prop["description"] = help_text.strip()
            properties[key] = prop
            if flag in required_flags or "(required)" in (help_text or "").lower():
                required.append(key)
            last = prop
            continue
        if HEADER.match(line):
            in_options = True
            last = None
            continue
        if last is not None and line.startswith(" ") and not line.lstrip().startswith("-"):
            last["description"] = (last.get("description", "") + " " + line.strip()).strip()
            continue
        if not in_options:
            description.append(line.strip())
    schema: dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        schema["required"] = required
    return " ".join(description), schema
