"""Registry mistakes reach the operator whole: every problem of an entry, the file, line and
column of a syntax error, and a named registry that is missing (issue 26, items 6 and 15)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.e2e.conftest import TOOLHOST, cli, stop

REL = "tools/external.tools.jsonc"
TWO_PROBLEMS = (
    '{"schemaVersion": 2, "sidecars": {"s": {"command": "python", "tools": ["t.a"],\n'
    ' "pool": {"max": "two"}, "timeoutMs": NaN}}}\n'
)
EXPECTED = [
    "sidecars.s.timeoutMs: NaN is not a number (JSON has no NaN or Infinity)",
    'sidecars.s.pool.max: expected int, got "two"',
]
# The comma after "tools" is missing: json5 stops at line 7, column 7.
SYNTAX_ERROR = """{
  "schemaVersion": 2,
  "sidecars": {
    "u": {
      "command": "python",
      "tools": ["a.b"]
      "timeoutMs": 5
    }
  }
}
"""
WHERE = "tools/external.tools.jsonc: not valid JSONC at line 7, column 7: unexpected '\"'"


def _write(root: Path, text: str) -> None:
    (root / "tools").mkdir(parents=True, exist_ok=True)
    (root / REL).write_text(text)


def _serve_log(root: Path) -> tuple[subprocess.Popen[bytes], list[str]]:
    """Start ``toolhost serve``; its log lines up to "toolhost serving"."""
    proc = subprocess.Popen(
        [*TOOLHOST, "serve", "--app-root", str(root)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env={**os.environ, "XDG_CONFIG_HOME": str(root / ".xdg")},
    )
    assert proc.stderr is not None
    lines: list[str] = []
    for raw in proc.stderr:
        lines.append(raw.decode(errors="replace"))
        if "toolhost serving" in lines[-1]:
            return proc, lines
    stop(proc)
    pytest.fail("toolhost serve exited early:\n" + "".join(lines))


def test_every_problem_of_an_entry_in_doctor_log_and_descriptor(tmp_path):
    root = tmp_path / "app"
    _write(root, TWO_PROBLEMS)
    report = json.loads(cli(root, "doctor", "--json", "--timeout", "10").stdout)
    (side,) = report["sidecars"]
    for problem in EXPECTED:
        assert problem in side["problems"], side["problems"]
    proc, lines = _serve_log(root)
    try:
        log = "".join(lines)
        for problem in EXPECTED:
            assert f"registry: {problem}" in log, log
        catalog = json.loads(cli(root, "catalog", "--json").stdout)
        tools = catalog["tools"] if isinstance(catalog, dict) else catalog
        (desc,) = [d for d in tools if d["name"] == "t.a"]
        (reason,) = [r for r in desc["stability"]["reasons"] if r["field"] == "manifest"]
        for problem in EXPECTED:
            assert problem in reason["message"], reason
    finally:
        stop(proc)


def test_a_syntax_error_names_file_line_and_column(tmp_path):
    root = tmp_path / "app"
    _write(root, SYNTAX_ERROR)
    out = cli(root, "doctor", "--timeout", "10")
    assert out.returncode == 1
    assert "registry: tools/external.tools.jsonc (not usable: see below)" in out.stdout
    assert f"  ! {WHERE}" in out.stdout, out.stdout
    assert "none found" not in out.stdout and "<string>" not in out.stdout + out.stderr
    proc, lines = _serve_log(root)
    try:
        log = "".join(lines)
        assert f"registry: {WHERE}" in log, log
        assert "(registry: tools/external.tools.jsonc (not usable))" in lines[-1]
        status = json.loads(cli(root, "status", "--json").stdout)
        assert status["registry"]["errors"] == [WHERE]
    finally:
        stop(proc)


def test_serve_with_a_missing_named_registry_says_so(tmp_path):
    root = tmp_path / "app"
    root.mkdir()
    out = subprocess.run(
        [*TOOLHOST, "serve", "--app-root", str(root), "--registry", "typo.jsonc"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "XDG_CONFIG_HOME": str(root / ".xdg")},
    )
    assert out.returncode != 0
    assert out.stderr.strip().splitlines() == [
        f"toolhost: registry {root / 'typo.jsonc'} does not exist (named by --registry)"
    ], out.stderr
    assert not (root / ".toolhost" / "host.sock").exists()
    doctor = cli(root, "doctor", "--registry", "typo.jsonc", "--timeout", "10")
    assert doctor.returncode == 1
    assert f"typo.jsonc: no such file ({root / 'typo.jsonc'})" in doctor.stdout
