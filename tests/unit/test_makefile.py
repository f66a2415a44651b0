"""`make serve` installs the runtime and the bundled families' extras, not the test tooling;
`make test` installs [test] whatever ran before it (issue 26, item 18). Checked with `make -n`
on a copy of the Makefile, stamps dated by hand."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="needs make")


def dry_run(folder: Path, target: str) -> str:
    out = subprocess.run(
        ["make", "-n", "-C", str(folder), target], capture_output=True, text=True, timeout=30
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


def installs(plan: str) -> list[str]:
    return [line for line in plan.splitlines() if "pip install" in line and " -e " in line]


def stamp(folder: Path, name: str, age: int) -> None:
    path = folder / ".venv" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch()
    when = 2_000_000_000 - age
    os.utime(path, (when, when))


@pytest.fixture
def copy(tmp_path: Path) -> Path:
    shutil.copy(ROOT / "Makefile", tmp_path / "Makefile")
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    os.utime(tmp_path / "pyproject.toml", (1_000_000_000, 1_000_000_000))
    return tmp_path


def test_serve_installs_no_test_tooling(copy):
    (line,) = installs(dry_run(copy, "serve"))
    assert "'.[web,media]'" in line, line
    assert "test" not in line


def test_test_after_serve_installs_the_test_extra(copy):
    stamp(copy, ".serve-stamp", 10)  # `make serve` ran, pyproject unchanged since
    assert installs(dry_run(copy, "serve")) == []
    (line,) = installs(dry_run(copy, "unit"))
    assert "'.[test,web,media,otel]'" in line, line
    (line,) = installs(dry_run(copy, "lint"))  # `make test` starts with lint
    assert "test," in line


def test_nothing_is_reinstalled_once_both_are_fresh(copy):
    stamp(copy, ".serve-stamp", 10)
    stamp(copy, ".installed-stamp", 10)
    assert installs(dry_run(copy, "serve")) == []
    assert installs(dry_run(copy, "unit")) == []
    # The test install refreshes the serve stamp too (it is a superset).
    (copy / ".venv" / ".serve-stamp").unlink()
    plan = dry_run(copy, "unit")
    assert installs(plan) == []
    os.utime(copy / "pyproject.toml", (2_100_000_000, 2_100_000_000))  # pyproject edited
    (line,) = installs(dry_run(copy, "unit"))
    assert "test," in line
    assert "touch .venv/.installed-stamp .venv/.serve-stamp" in dry_run(copy, "unit")
