"""The ``media`` sidecar: vision and audio tools bridged to a provider or local delegates.

Run it with ``python -m sidecars.media``. The sidecar itself is in :mod:`sidecars.media.server`;
this package stays import-light so the bundled delegates (``sidecars.media.delegates.*``, run
once per call) do not pay for the SDK. ``sidecars.media.app`` is loaded on first access.
"""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    if name == "app":
        from sidecars.media.server import app

        return app
    raise AttributeError(name)
