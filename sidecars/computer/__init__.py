"""The ``computer.native`` sidecar: screenshots, windows, mouse and keyboard.

Run it with ``python -m sidecars.computer``. ``screen.screenshot`` and ``computer.window`` use
platform commands found on PATH (:mod:`sidecars.computer.platform`); ``computer.mouse`` and
``computer.keyboard`` run only through the delegate commands of ``config.mouseCommand`` /
``config.keyboardCommand`` (:mod:`sidecars.computer.control`), and default to
``approval-required``. The bundled xdotool delegate is :mod:`sidecars.computer.xdo`.
See docs/sidecars/computer.md.

:data:`app` is built on first access, so ``python -m sidecars.computer.xdo`` (the delegate)
starts without loading the sidecar.
"""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    if name == "app":
        from sidecars.computer.tools import app

        return app
    raise AttributeError(name)
