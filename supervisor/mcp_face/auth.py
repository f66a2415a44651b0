"""The bearer tokens of ``toolhost mcp --http`` and the profile each one gives its clients.

# Strategy: ``--token-file`` (default ``.toolhost/mcp.token``) is the default token, giving the
# profile of ``--profile``/``--tools`` (or everything); every ``host.mcp.tokens.<name>`` is one
# more token with its own profile, so each client on one port sees its own slice. Token files
# are read with :mod:`supervisor.private_files` like the host's other tokens (never through a
# symlink, 0600, generated when missing) when ``toolhost mcp`` starts and on SIGHUP, never per
# request: :func:`load_tokens` builds a fresh :class:`TokenTable` that the server swaps in whole.
# A file that cannot be read at a reload keeps the token read before it (and says so). A request
# is matched against every token in constant time (:meth:`TokenTable.identify`), so neither
# whether nor which token matched shows in the timing.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Callable
from typing import NamedTuple

from supervisor.contracts.registry import McpConfig
from supervisor.mcp_face.profiles import Profile, from_config
from supervisor.private_files import read_token

log = logging.getLogger("toolhost.mcp")

DEFAULT = "default"
"""The identity of the ``--token-file`` token."""


class Identity(NamedTuple):
    """Who a request is: the token's name and the profile it gives (None: everything)."""

    name: str
    profile: Profile | None


class TokenTable:
    """Accepted ``Authorization`` values and the identity of each."""

    def __init__(self, tokens: dict[str, tuple[str, Identity]]) -> None:
        self.tokens = tokens
        """name -> (token, identity); kept so a reload can fall back to a token read before."""
        self._expected = [(f"Bearer {t}".encode(), ident) for t, ident in tokens.values()]

    @classmethod
    def single(cls, token: str, profile: Profile | None = None) -> TokenTable:
        """One token (``--token-file``'s) and its profile."""
        return cls({DEFAULT: (token, Identity(DEFAULT, profile))})

    def identify(self, authorization: bytes) -> Identity | None:
        """The identity of an ``Authorization`` header value, or None when no token matches;
        every token is compared, in constant time, whatever matched first."""
        given = authorization.strip()
        found: Identity | None = None
        for expected, ident in self._expected:
            if hmac.compare_digest(given, expected) and found is None:
                found = ident
        return found


def load_tokens(
    default_file: str,
    default_profile: Profile | None,
    config: McpConfig,
    path: Callable[[str], str],
    previous: TokenTable | None = None,
) -> tuple[TokenTable, list[str]]:
    """Read every token file: ``default_file`` and each of ``config.tokens``.

    Args:
        default_file: ``--token-file`` (absolute).
        default_profile: What the default token gives (``--profile``/``--tools``).
        config: ``host.mcp`` (already checked by the registry loader).
        path: Makes a ``tokenFile`` absolute (relative ones are under the app root).
        previous: The table in use (a reload): a file that cannot be read keeps its token.

    Returns:
        The new table and what went wrong (a token not read, two files with one token).
    """
    problems: list[str] = []
    tokens: dict[str, tuple[str, Identity]] = {}
    wanted = [(DEFAULT, default_file, default_profile, "--token-file")]
    for name, entry in sorted(config.tokens.items()):
        profile = None
        if entry.profile is not None and entry.profile in config.profiles:
            profile = from_config(entry.profile, config.profiles[entry.profile])
        wanted.append((name, path(entry.token_file), profile, f"host.mcp.tokens.{name}"))
    seen: dict[str, str] = {}
    for name, file, profile, where in wanted:
        try:
            token = read_token(file)
        except (OSError, ValueError) as exc:
            kept = previous.tokens.get(name) if previous is not None else None
            if kept is None:
                problems.append(f"{where}: cannot read {file}: {exc}; this token is not accepted")
                continue
            problems.append(f"{where}: cannot read {file}: {exc}; the token read before is kept")
            token = kept[0]
        if token in seen:
            problems.append(
                f"{where}: {file} holds the same token as {seen[token]}; each client needs its "
                "own token (this one is not accepted)"
            )
            continue
        seen[token] = where
        tokens[name] = (token, Identity(name, profile))
    return TokenTable(tokens), problems
