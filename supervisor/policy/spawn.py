"""Which workers may be forked from the zygote (PROTOCOL 1 ``spawn``; docs/zygote.md).

Pure: no trio, no processes. The runtime asks :func:`eligible` once per sidecar (static facts
of its entry) and :func:`startup_env_difference` per start (the worker's environment against
the zygote's).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

STARTUP_PYTHON = ("python", "python3")
INTERPRETER_ENV = frozenset(("LANG", "HOME"))
INTERPRETER_ENV_PREFIXES = ("LC_", "PYTHON")
"""Variables a Python interpreter reads while starting (locale and stdio encoding, the user
site folder, every ``PYTHON*`` setting). ``TZ`` is not one: the worker applies it itself
(``time.tzset``)."""


def eligible(protocol: str, mode: str, spawn: str, command: str, args: Sequence[str]) -> bool:
    """``spawn: auto`` and a persistent process-json worker run by the host's python
    (``python``/``python3``) with ``-m <module>`` or a script and no interpreter flags."""
    if spawn != "auto" or protocol != "process-json" or mode != "persistent":
        return False
    if command not in STARTUP_PYTHON or not args:
        return False
    if args[0] == "-m":
        return len(args) >= 2 and bool(args[1]) and not args[1].startswith("-")
    return bool(args[0]) and not args[0].startswith("-")


def startup_env_difference(env: Mapping[str, str], zygote_env: Mapping[str, str]) -> str | None:
    """The first interpreter-startup variable whose value differs (None: none does)."""
    for key in sorted(set(env) | set(zygote_env)):
        startup = key in INTERPRETER_ENV or key.startswith(INTERPRETER_ENV_PREFIXES)
        if startup and env.get(key) != zygote_env.get(key):
            return key
    return None
