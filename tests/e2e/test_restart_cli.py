"""``toolhost restart`` takes effect at once, also while the sidecar waits out its slow retry
after the restart intensity was exceeded (PROTOCOL 4)."""

import json

import trio

from tests.conftest import echo, write_registry
from tests.e2e.conftest import cli, serve
from tests.e2e.test_serve import wait_visible


def test_restart_during_the_slow_retry(tmp_path):
    root = tmp_path / "app"
    root.mkdir()
    entry = echo(
        tools=["echo.say", "echo.crash"],
        restart={"intensity": 1, "backoffMs": 20, "maxBackoffMs": 60_000},
    )
    write_registry(root, {"echo": entry})
    with serve(root):
        trio.run(wait_visible, root / ".toolhost" / "host.sock", ["echo.say"])
        assert cli(root, "invoke", "echo.crash", "{}").returncode == 1
        # Inside the intensity: the call waits for the replacement and succeeds.
        r = cli(root, "invoke", "echo.say", json.dumps({"text": "window"}))
        assert r.returncode == 0, r.stdout + r.stderr
        assert cli(root, "invoke", "echo.crash", "{}").returncode == 1
        # Past it: failed, next try in 60 s; calls are refused at once.
        r = cli(root, "invoke", "echo.say", json.dumps({"text": "refused"}))
        assert r.returncode == 2, r.stdout + r.stderr
        r = cli(root, "restart", "echo", "--force")
        assert r.returncode == 0 and "restarted echo" in r.stdout, r.stderr
        trio.run(wait_visible, root / ".toolhost" / "host.sock", ["echo.say"])
        r = cli(root, "invoke", "echo.say", json.dumps({"text": "back"}))
        assert r.returncode == 0, r.stdout + r.stderr
