"""``toolhost mcp`` says what is wrong in one line, like ``toolhost serve``: a registry named with
``--registry`` that does not exist, and (``--embedded``) a host that refuses to start because its
audit log is a symlink (issue 30) or another host runs on its app root, never "internal
error"."""

from __future__ import annotations

import subprocess
import time

from supervisor.cli.mcp import EMBEDDED_LOCK_WAIT_S
from tests.conftest import echo, hold_host_lock, write_registry
from tests.e2e.conftest import cli, serve


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


def test_one_host_per_app_root(app):
    """A second host on a served root (``mcp --embedded``, a ``serve`` on another socket) would
    count quotas apart and overwrite ``.toolhost/quota-state.json``: it is refused in one line
    naming the running host, and it leaves nothing behind."""
    write_registry(app, {"echo": echo(tools=["echo.say"])})
    other = app / ".toolhost" / "other.sock"
    with serve(app) as running:
        embedded = _mcp(app, "--embedded")
        assert embedded.returncode == 1, embedded
        line = embedded.stderr.strip()
        assert "\n" not in line and "internal error" not in line, line
        assert f"pid {running.pid}" in line and "without --embedded" in line, line
        second = cli(app, "serve", "--no-global", "--socket", str(other))
        assert second.returncode == 1, second
        assert f"pid {running.pid}" in second.stderr, second.stderr
        assert "--app-root" in second.stderr and "--embedded to" not in second.stderr
        assert not other.exists()  # the socket it had bound is gone again
        assert running.poll() is None  # the running host is untouched
    # The lock goes with its host: the root can be served embedded once the serve has ended.
    assert (app / ".toolhost" / "host.lock").read_text() == ""
    done = _mcp(app, "--embedded", "--tools", "echo.*")
    assert done.returncode == 0, done.stderr


def test_an_embedded_host_waits_for_the_one_still_stopping(app):
    """A front-end restarting its MCP server starts the new ``--embedded`` while the old one
    still stops (its lock held for up to 10 s): the new one waits for it instead of failing."""
    write_registry(app, {"echo": echo(tools=["echo.say"])})
    holder = hold_host_lock(app, "embedded", seconds=1.5)  # the old one, stopping
    started = time.monotonic()
    done = _mcp(app, "--embedded", "--tools", "echo.*")
    assert holder.wait(timeout=10) == 0
    assert done.returncode == 0, done.stderr
    assert "already runs" not in done.stderr
    assert time.monotonic() - started > 1.0  # it did wait for the holder to go


def test_an_embedded_host_beside_a_serve_still_starting_is_refused_at_once(app):
    """A ``toolhost serve`` holds the lock from its start, before it records ``serving.json``
    (its sidecars may take seconds to start): an ``--embedded`` started then is refused at once,
    naming the serve, instead of waiting as it does for another embedded host."""
    write_registry(app, {"echo": echo(tools=["echo.say"])})
    starting = hold_host_lock(app, "serve")  # a serve between its lock and serving.json
    try:
        assert not (app / ".toolhost" / "serving.json").exists()
        began = time.monotonic()
        done = _mcp(app, "--embedded", "--tools", "echo.*")
        waited = time.monotonic() - began
        assert done.returncode != 0
        assert f"pid {starting.pid}: `toolhost serve`)" in done.stderr
        assert "without --embedded" in done.stderr
        assert waited < EMBEDDED_LOCK_WAIT_S  # not the wait for an embedded host to end
    finally:
        starting.communicate("", timeout=10)
