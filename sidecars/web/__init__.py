"""The ``web`` sidecar: fetch, extract, download and search over http(s), SSRF-guarded.

Run it with ``python -m sidecars.web``. Tools, limits and the network policy are documented in
``docs/sidecars/web.md``; the sidecar is :mod:`sidecars.web.server` (loaded on first access of
``sidecars.web.app``, so the pure :mod:`sidecars.web.policy` imports without httpx).
"""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    if name == "app":
        from sidecars.web.server import app

        return app
    raise AttributeError(name)
