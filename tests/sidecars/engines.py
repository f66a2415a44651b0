"""Skip a test for a missing engine locally; with ``CI=true`` fail instead (HELPERS: never skip)."""

from __future__ import annotations

import importlib.util
import os
import shutil

import pytest


def need_binary(name: str, package: str) -> None:
    """Skip (or, under CI, fail) unless ``name`` is on PATH."""
    if shutil.which(name) is None:
        _missing(f"{name} is not installed (Debian package {package})")


def need_module(name: str, extra: str) -> None:
    """Skip (or, under CI, fail) unless Python module ``name`` is importable."""
    if importlib.util.find_spec(name) is None:
        _missing(f"Python package {name} is not installed (toolhost extra '{extra}')")


def _missing(reason: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI=true and {reason}")
    pytest.skip(reason)
