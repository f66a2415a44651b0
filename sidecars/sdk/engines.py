"""Engines a sidecar imports (httpx, trafilatura, ...): checked before ``ready``, not per call.

# Strategy: a sidecar declares each third-party module its tools import with
# ``app.engine(module, install=..., tools=...)`` and imports it lazily inside the tools, so the
# process starts without it. The SDK imports every declared module once, for real, before it
# sends ``ready`` (a module that is found but fails while importing counts: ``lxml.html.clean``
# without ``lxml_html_clean``). A tool whose engine failed is ``unavailable`` in every ``pong``
# (code ``engine-missing``, the import error as reason, the package to install as hint), so the
# snapshot and ``toolhost doctor`` show it before any call, and a call is answered
# ``unavailable`` with the same words without running the tool: never ``available`` followed by
# an ImportError per call. The same rule as a missing browser, tesseract or espeak-ng.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Iterable
from dataclasses import dataclass

from supervisor.contracts import wire

CODE = "engine-missing"


@dataclass(frozen=True)
class Engine:
    """A module some tools import, and what to install when it cannot be imported."""

    module: str
    install: str
    tools: tuple[str, ...] | None = None
    """The tools that need it; None: every tool of the sidecar."""


@dataclass(frozen=True)
class Missing:
    """An engine that could not be imported, and why."""

    engine: Engine
    error: str

    @property
    def reason(self) -> str:
        return f"cannot import {self.engine.module} ({self.error})"

    def health(self) -> wire.ToolHealth:
        return wire.ToolHealth(
            status="unavailable", reason=self.reason, hint=self.engine.install, code=CODE
        )

    def result(self, tool: str) -> wire.Result:
        """The ``unavailable`` answer to a call of ``tool``."""
        return wire.Result(
            id=0,
            ok=False,
            code="unavailable",
            error=f"{tool} is unavailable: {self.reason}; install: {self.engine.install}",
            details={
                "reason": CODE,
                "engine": self.engine.module,
                "error": self.error,
                "hint": self.engine.install,
            },
        )


_checked: dict[str, str | None] = {}
_lock = threading.Lock()


def import_problem(module: str) -> str | None:
    """Why ``module`` cannot be imported (``"ImportError: ..."`` on one line), or None.

    The module is imported for real, once per process.
    """
    with _lock:
        if module not in _checked:
            try:
                importlib.import_module(module)
                _checked[module] = None
            except Exception as exc:  # a broken install may raise anything while importing
                text = " ".join(str(exc).split()) or "no message"
                _checked[module] = f"{type(exc).__name__}: {text}"
        return _checked[module]


def missing(engines: Iterable[Engine], tools: Iterable[str]) -> dict[str, Missing]:
    """Tool -> its first engine that cannot be imported (tools absent: every engine imports)."""
    names = list(tools)
    out: dict[str, Missing] = {}
    for engine in engines:
        error = import_problem(engine.module)
        if error is None:
            continue
        for tool in engine.tools if engine.tools is not None else names:
            out.setdefault(tool, Missing(engine, error))
    return out
