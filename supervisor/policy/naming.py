"""Provider-safe tool names.

OpenAI and Anthropic accept tool names matching ``^[a-zA-Z0-9_-]{1,64}$``: a dot becomes ``__``
(``file.hash`` -> ``file__hash``), any other character outside the set becomes ``_``, and the
host maps the provider name back on invoke. MCP accepts dots, so MCP names are kept as they are.
"""

from __future__ import annotations

import re

_UNSAFE = re.compile(r"[^a-zA-Z0-9_-]")


def provider_name(name: str) -> str:
    """``file.hash`` -> ``file__hash`` (at most 64 characters)."""
    return _UNSAFE.sub("_", name.replace(".", "__"))[:64]
