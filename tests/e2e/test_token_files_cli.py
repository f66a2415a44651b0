"""Issue 30 item 2 through the real commands: the gateway token of ``toolhost serve`` is read at
start and at reload only; a symlinked audit log or MCP token makes the command exit with a clear
error, never following the link."""

import json
import os
import stat
import subprocess

import pytest
import trio
from trio_websocket import ConnectionRejected, open_websocket_url

from tests.conftest import echo, free_port, write_registry
from tests.e2e.conftest import TOOLHOST, cli, serve

SYMLINK = "is a symlink; refusing to follow it"


def ws_status(port, token):
    """101 when the gateway accepts ``token``, else the HTTP status it answered."""

    async def attempt():
        headers = [(b"Authorization", f"Bearer {token}".encode())]
        try:
            async with open_websocket_url(f"ws://127.0.0.1:{port}/ws", extra_headers=headers):
                return 101
        except ConnectionRejected as exc:
            return exc.status_code

    return trio.run(attempt)


def test_the_gateway_token_is_read_at_start_and_at_reload_only(tmp_path):
    root = tmp_path / "app"
    (root / ".toolhost").mkdir(parents=True, mode=0o700)
    token_file = root / ".toolhost" / "ws.token"
    token_file.write_text("first-token\n")
    token_file.chmod(0o600)
    port = free_port()
    write_registry(
        root,
        {"echo": echo(tools=["echo.say"])},
        host={"ws": {"listen": f"127.0.0.1:{port}", "tokenFile": ".toolhost/ws.token"}},
    )
    with serve(root):
        assert ws_status(port, "first-token") == 101
        tmp = token_file.with_name("ws.token.new")
        tmp.write_text("second-token\n")
        tmp.chmod(0o600)
        os.replace(tmp, token_file)  # what a tool writing into .toolhost/ could do
        assert ws_status(port, "second-token") == 401
        assert ws_status(port, "first-token") == 101
        assert cli(root, "reload").returncode == 0
        assert ws_status(port, "second-token") == 101
        assert ws_status(port, "first-token") == 401
    audit = [json.loads(x) for x in (root / ".toolhost" / "audit.jsonl").read_text().splitlines()]
    assert [x for x in audit if x.get("event") == "token-changed"] == [
        {
            "time": audit[-1]["time"],
            "event": "token-changed",
            "token": "gateway",
            "path": str(token_file),
        }
    ]


def test_serve_refuses_a_symlinked_audit_log_and_leaves_its_target_alone(tmp_path):
    root = tmp_path / "app"
    (root / ".toolhost").mkdir(parents=True, mode=0o700)
    target = tmp_path / "elsewhere.log"
    target.write_text("someone else's log\n")
    target.chmod(0o644)
    link = root / ".toolhost" / "audit.jsonl"
    link.symlink_to(target)
    write_registry(root, {"echo": echo(tools=["echo.say"])})
    proc = subprocess.run(
        [*TOOLHOST, "serve", "--app-root", str(root), "--no-global"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 1, proc.stderr
    assert f"{link} {SYMLINK}" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert target.read_text() == "someone else's log\n"
    assert stat.S_IMODE(target.stat().st_mode) == 0o644


@pytest.mark.parametrize("dangling", [False, True])
def test_mcp_http_refuses_a_symlinked_token_file(tmp_path, dangling):
    root = tmp_path / "app"
    (root / ".toolhost").mkdir(parents=True, mode=0o700)
    target = tmp_path / "elsewhere.token"
    if not dangling:
        target.write_text("a token for something else\n")
        target.chmod(0o644)
    link = root / ".toolhost" / "mcp.token"
    link.symlink_to(target)
    proc = subprocess.run(
        [*TOOLHOST, "mcp", "--app-root", str(root), "--http", "127.0.0.1:0"],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, "XDG_CONFIG_HOME": str(root / ".xdg")},
    )
    assert proc.returncode != 0
    assert f"{link} {SYMLINK}" in proc.stderr
    if dangling:
        assert not os.path.lexists(target)  # never created through the link
    else:
        assert target.read_text() == "a token for something else\n"
        assert stat.S_IMODE(target.stat().st_mode) == 0o644
