"""Per-client profiles of ``toolhost mcp``: which tools, resources and prompts one client sees.

# Strategy: a :class:`Profile` is a name and three lists of shell-style patterns (``web.*``,
# ``file.hash``, ``file:///repo/*``), compiled once into one regular expression per kind. It is
# pure: the face asks it to filter a list (:meth:`Profile.tools_of`, :meth:`resources_of`,
# :meth:`templates_of`, :meth:`prompts_of`) or whether one name may be used
# (:meth:`Profile.allows`), and turns a refusal into the MCP error text that names the profile
# (:meth:`Profile.refusal`). Where a profile comes from is the caller's: ``--tools PATTERNS``
# (:func:`from_patterns`), ``--profile NAME`` or a bearer token's profile in
# ``host.mcp.profiles`` (:func:`from_config`). No profile (None) means everything: today's
# behaviour. A kind a profile does not name is hidden (an allowlist fails closed).
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable, Mapping
from typing import Any, Literal

from supervisor.contracts.registry import McpConfig, McpProfileConfig

Kind = Literal["tool", "resource", "prompt"]

_NOTHING = re.compile(r"(?!)")


def _compile(patterns: Iterable[str]) -> re.Pattern[str]:
    parts = [fnmatch.translate(p) for p in patterns]
    return re.compile("|".join(parts)) if parts else _NOTHING


class Profile:
    """A named slice of what the host serves over MCP.

    Args:
        name: How errors name it (a registry profile's name, or ``--tools '...'``).
        tools: Patterns of tool names.
        resources: Patterns of resource URIs (and of resource templates' URI templates).
        prompts: Patterns of prompt names.
    """

    __slots__ = ("_match", "name", "patterns")

    def __init__(
        self,
        name: str,
        *,
        tools: Iterable[str] = (),
        resources: Iterable[str] = (),
        prompts: Iterable[str] = (),
    ) -> None:
        self.name = name
        self.patterns: dict[Kind, tuple[str, ...]] = {
            "tool": tuple(tools),
            "resource": tuple(resources),
            "prompt": tuple(prompts),
        }
        self._match = {kind: _compile(p).fullmatch for kind, p in self.patterns.items()}

    def __repr__(self) -> str:
        return f"Profile({self.name!r}, {self.patterns!r})"

    def allows(self, kind: Kind, name: str) -> bool:
        """Whether the tool, resource URI or prompt ``name`` is in this profile."""
        return self._match[kind](name) is not None

    def refusal(self, kind: Kind, name: str) -> str:
        """The MCP error text for a call, read or get outside this profile."""
        return f"{kind} {name!r} is not in profile {self.name!r}"

    def _of(self, kind: Kind, key: str, items: list[Any]) -> list[Any]:
        match = self._match[kind]
        return [
            i for i in items if isinstance(i, Mapping) and match(str(i.get(key, ""))) is not None
        ]

    def tools_of(self, tools: list[Any]) -> list[Any]:
        """The MCP tools (objects with ``name``) this profile shows, in order."""
        return self._of("tool", "name", tools)

    def resources_of(self, resources: list[Any]) -> list[Any]:
        """The MCP resources (objects with ``uri``) this profile shows."""
        return self._of("resource", "uri", resources)

    def templates_of(self, templates: list[Any]) -> list[Any]:
        """The resource templates (objects with ``uriTemplate``) this profile shows."""
        return self._of("resource", "uriTemplate", templates)

    def prompts_of(self, prompts: list[Any]) -> list[Any]:
        """The MCP prompts (objects with ``name``) this profile shows."""
        return self._of("prompt", "name", prompts)


def split_patterns(text: str) -> list[str]:
    """``'web.*, file.hash'`` as ``['web.*', 'file.hash']`` (empty items dropped)."""
    return [p.strip() for p in text.split(",") if p.strip()]


def from_patterns(text: str) -> Profile:
    """The profile of ``--tools PATTERNS``: those tools, no resources, no prompts.

    Raises:
        ValueError: No pattern in ``text``.
    """
    patterns = split_patterns(text)
    if not patterns:
        raise ValueError("--tools needs at least one pattern, e.g. --tools 'web.*,file.hash'")
    return Profile(f"--tools {','.join(patterns)}", tools=patterns)


def from_config(name: str, config: McpProfileConfig) -> Profile:
    """``host.mcp.profiles.<name>`` as a profile."""
    return Profile(name, tools=config.tools, resources=config.resources, prompts=config.prompts)


def named(mcp: McpConfig, name: str) -> Profile:
    """The registry profile ``name``.

    Raises:
        KeyError: No such profile; the message lists the ones there are.
    """
    config = mcp.profiles.get(name)
    if config is None:
        known = ", ".join(sorted(mcp.profiles)) or "none in the registry"
        raise KeyError(f"no profile {name!r} in host.mcp.profiles (profiles: {known})")
    return from_config(name, config)
