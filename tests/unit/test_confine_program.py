"""Which file a sidecar's command runs (its folder is granted read): interpreter flags before
the script or ``-m`` module are skipped, so ``python -B script.py`` grants the script's folder."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from supervisor.processes.confine import program_of


@pytest.mark.parametrize(
    "flags",
    [[], ["-B"], ["-u", "-B"], ["-uB"], ["-W", "error"], ["-Werror"], ["-X", "dev"], ["--"]],
)
def test_the_script_after_interpreter_flags(tmp_path: Path, flags: list[str]) -> None:
    script = tmp_path / "tool.py"
    script.write_text("")
    argv = [sys.executable, *flags, "tool.py", "-B", "--x"]
    assert program_of(argv, str(tmp_path)) == str(script)


@pytest.mark.parametrize("flags", [["-m", "toolpkg"], ["-B", "-m", "toolpkg"], ["-um", "toolpkg"]])
def test_the_module_after_interpreter_flags(tmp_path: Path, flags: list[str]) -> None:
    (tmp_path / "toolpkg").mkdir()
    (tmp_path / "toolpkg" / "__init__.py").write_text("")
    argv = [sys.executable, *flags, "--arg"]
    assert program_of(argv, str(tmp_path)) == str(tmp_path / "toolpkg" / "__init__.py")


def test_a_command_string_runs_no_file(tmp_path: Path) -> None:
    assert program_of([sys.executable, "-c", "print()"], str(tmp_path)) == sys.executable
    assert program_of(["/usr/bin/node", "server.js"], str(tmp_path)) == "/usr/bin/node"
