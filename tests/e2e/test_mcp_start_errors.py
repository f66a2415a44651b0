"""``toolhost mcp`` says what is wrong in one line, like ``toolhost serve``: a registry named with
``--registry`` that does not exist, and (``--embedded``) a host that refuses to start because its
audit log is a symlink (issue 30), never "internal error"."""

from __future__ import annotations

import subprocess

from tests.conftest import write_registry
from tests.e2e.conftest import cli


def _mcp(root, *extra: str) -> subprocess.CompletedProcess[str]:
    return cli(root, "mcp", "--no-global", *extra, input="")  # stdin: empty, not the terminal


def test_a_missing_registry_named_explicitly_is_an_error(app):
    for extra in (["--embedded"], []):
        done = _mcp(app, "--registry", str(app / "typo.jsonc"), *extra)
        assert done.returncode == 64, done
        assert f"registry {app / 'typo.jsonc'} does not exist" in done.stderr
        assert "internal error" not in done.stderr


def test_an_embedded_host_that_refuses_to_start_says_why(app, tmp_path):
    write_registry(app, {})
    (app / ".toolhost").mkdir(mode=0o700)
    elsewhere = tmp_path / "elsewhere.jsonl"
    elsewhere.write_text("keep\n")
    (app / ".toolhost" / "audit.jsonl").symlink_to(elsewhere)
    done = _mcp(app, "--embedded")
    assert done.returncode == 1, done
    assert "symlink" in done.stderr and "internal error" not in done.stderr, done.stderr
    assert elsewhere.read_text() == "keep\n"
