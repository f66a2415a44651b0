"""Fixtures for the utility sidecar tests: a project directory and an in-process tool runner.

Tools run through ``app.execute`` (the SDK's own dispatch: input decoding, ToolError mapping)
with ``tmp_path/"project"`` as projectDir, so most tests need no subprocess.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import msgspec
import pytest

from sidecars.sdk import Context
from sidecars.utility import app
from supervisor.contracts import wire


class Utility:
    """Runs utility tools in-process against one project directory."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def run(self, tool: str, payload: dict[str, Any], *, cancelled: bool = False) -> wire.Result:
        """Execute ``tool``; with ``cancelled`` the call's cancel flag is already set."""
        flag = threading.Event()
        if cancelled:
            flag.set()
        return app.execute(tool, msgspec.json.encode(payload), Context(app, None, 0, flag))

    def ok(self, tool: str, payload: dict[str, Any]) -> Any:
        """Execute ``tool``, assert success and return the decoded ``data``."""
        result = self.run(tool, payload)
        assert result.ok, (result.code, result.error, result.details)
        return msgspec.json.decode(result.data)

    def refuse(
        self, tool: str, payload: dict[str, Any], code: str, reason: str
    ) -> tuple[dict[str, Any], str]:
        """Execute ``tool``, assert ``code`` and ``details.reason``; return details and error."""
        result = self.run(tool, payload)
        assert not result.ok, msgspec.json.decode(result.data)
        details = result.details or {}
        assert (result.code, details.get("reason")) == (code, reason), (result.error, details)
        assert result.error
        return details, result.error

    def configure(self, **config: Any) -> None:
        """Replace the sidecar config (restored after the test by the ``project`` fixture)."""
        app.config = config

    def write(self, rel: str, data: bytes | str) -> Path:
        """Create a file below the project, with its parent directories."""
        path = self.root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(data, str):
            path.write_text(data, encoding="utf-8")
        else:
            path.write_bytes(data)
        return path

    def names(self, rel: str = ".") -> list[str]:
        """Sorted entry names of a project directory."""
        return sorted(p.name for p in (self.root / rel).iterdir())

    def tree(self, rel: str) -> dict[str, bytes | None]:
        """Every path below a project directory mapped to its bytes (``None``: directory)."""
        top = self.root / rel
        return {
            p.relative_to(top).as_posix(): None if p.is_dir() else p.read_bytes()
            for p in sorted(top.rglob("*"))
        }


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty project directory, installed as the sidecar's projectDir with empty config."""
    root = tmp_path / "project"
    root.mkdir()
    monkeypatch.setattr(app, "project_dir", str(root))
    monkeypatch.setattr(app, "config", {})
    return root


@pytest.fixture
def utility(project: Path) -> Utility:
    """The in-process runner for the ``project`` directory."""
    return Utility(project)
