"""State survives ``kill -9`` of the host; ``toolhost state`` and ``toolhost vault`` for
operators (PROTOCOL 3.5)."""

import json
import os
import signal
import stat

import trio

from tests.conftest import script, write_registry
from tests.e2e.conftest import cli, serve
from tests.e2e.test_serve import wait_visible

TOOLS = ["svc.run", "svc.compose", "svc.nest"]


def registry(root):
    entry = script(
        "services",
        TOOLS,
        state=[{"name": "notes", "keyPrefix": "n/"}],
        vault=[{"key": "TOKEN"}],
    )
    write_registry(root, {"svc": entry})


def run(root, requests):
    r = cli(root, "invoke", "svc.run", json.dumps({"requests": requests}))
    assert r.returncode == 0, r.stdout + r.stderr
    return json.loads(r.stdout)["data"]["responses"]


def test_state_survives_kill_9_and_the_operator_commands(tmp_path):
    root = tmp_path / "app"
    root.mkdir()
    registry(root)
    sock = root / ".toolhost" / "host.sock"
    with serve(root) as proc:
        trio.run(wait_visible, sock, ["svc.run"])
        set_a = {"method": "state.set", "params": {"name": "notes", "key": "n/a", "value": [1, 2]}}
        assert "error" not in run(root, [set_a])[0]
        os.kill(proc.pid, signal.SIGKILL)  # no graceful stop: the answered write must be on disk
        proc.wait(timeout=10)
    with serve(root):
        trio.run(wait_visible, sock, ["svc.run"])
        get_a = {"method": "state.get", "params": {"name": "notes", "key": "n/a"}}
        assert run(root, [get_a])[0]["result"] == {"value": [1, 2]}

    r = cli(root, "state", "list")
    assert r.returncode == 0 and "notes" in r.stdout and "1 key(s)" in r.stdout, r.stderr
    r = cli(root, "state", "get", "notes", "n/a")
    assert r.returncode == 0 and json.loads(r.stdout) == [1, 2], r.stderr
    r = cli(root, "state", "delete", "notes", "n/a")
    assert r.returncode == 0, r.stderr
    assert cli(root, "state", "get", "notes", "n/a").returncode == 1

    # vault: the value comes from stdin, is never printed by list, and the file is private
    r = cli(root, "vault", "set", "TOKEN", input="tok-123456\n")
    assert r.returncode == 0 and "tok-123456" not in r.stdout, r.stderr
    path = root / ".toolhost" / "vault.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    r = cli(root, "vault", "list")
    assert r.returncode == 0 and "TOKEN" in r.stdout and "tok-123456" not in r.stdout
    os.chmod(path, 0o644)
    r = cli(root, "vault", "list")
    assert r.returncode == 1 and "chmod 600" in r.stderr
    assert "Traceback" not in r.stderr
    os.chmod(path, 0o600)
    assert cli(root, "vault", "delete", "TOKEN").returncode == 0
    assert cli(root, "vault", "delete", "TOKEN").returncode == 1
