"""The extensions ``server.hello`` announces are the ones docs/kernel-protocol.md lists."""

from __future__ import annotations

import re
from pathlib import Path

from supervisor.server.methods import CAPABILITIES

DOC = Path(__file__).resolve().parents[2] / "docs" / "kernel-protocol.md"


def _doc_names() -> list[str]:
    text = DOC.read_text(encoding="utf-8")
    section = text.split("## Extensions, in one place", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^\| `([^`]+)` \|", section, flags=re.MULTILINE)


def test_every_announced_extension_has_a_row_and_every_row_is_announced() -> None:
    announced = CAPABILITIES["extensions"]
    assert isinstance(announced, list)
    assert len(set(announced)) == len(announced), "an extension is announced twice"
    assert _doc_names() == announced
