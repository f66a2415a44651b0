"""A reload names the settings it cannot apply, and the CLI still finds the running host after
``host.socket`` was edited (issue 26, item 16)."""

from __future__ import annotations

import json
import signal

import trio

from tests.conftest import echo, write_registry
from tests.e2e.conftest import cli, serve
from tests.e2e.test_request_before_eof import HostLog
from tests.e2e.test_serve import wait_visible


def test_reload_names_what_needs_a_restart_and_the_cli_still_finds_the_host(tmp_path):
    root = tmp_path / "app"
    sidecars = {"echo": echo(tools=["echo.say"])}
    write_registry(root, sidecars)
    sock = root / ".toolhost" / "host.sock"
    serving = root / ".toolhost" / "serving.json"
    with serve(root) as host:
        log = HostLog(host)
        trio.run(wait_visible, sock, ["echo.say"])
        write_registry(
            root,
            sidecars,
            host={
                "socket": ".toolhost/moved.sock",
                "ws": {"listen": "127.0.0.1:0", "tokenFile": ".toolhost/ws.token"},
            },
        )
        out = cli(root, "reload")
        assert out.returncode == 0, out.stderr
        assert "needs a restart of toolhost: host.socket, host.ws changed" in out.stdout, out
        result = json.loads(cli(root, "reload", "--json").stdout)
        assert result["needsRestart"] == ["host.socket", "host.ws"], result
        log.wait("host.socket, host.ws changed; a reload cannot apply that")

        # The host still serves on the socket it started with, and the CLI finds it there.
        status = cli(root, "invoke", "echo.say", '{"text": "still here"}')
        assert status.returncode == 0, status.stderr
        assert "still here" in status.stdout
        assert not (root / ".toolhost" / "moved.sock").exists()

        host.send_signal(signal.SIGHUP)  # the same answer by signal, in the log
        log.wait("not applied until toolhost restarts: host.socket, host.ws")
        assert json.loads(serving.read_text())["unix"] == str(sock)  # how the CLI found it
    assert not serving.exists(), "the record outlived its host"
