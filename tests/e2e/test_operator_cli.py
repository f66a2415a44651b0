"""The operator's commands against a real ``toolhost serve`` (issue 12): ``status`` lists calls
waiting for approval, ``toolhost approve`` releases one; ``restart`` says which workers it replaced
and fails for a sidecar that does not exist."""

import json
import re
import subprocess
import time

from tests.conftest import echo, script, write_registry
from tests.e2e.conftest import TOOLHOST, cli, serve


def test_status_lists_waiting_calls_and_approve_releases_them(tmp_path):
    root = tmp_path / "app"
    root.mkdir()
    reg = {"echo": echo(tools=["echo.say"], sandbox={"echo.say": "approval-required"})}
    write_registry(root, reg, host={"approvalSource": "operator"})
    with serve(root):
        call = subprocess.Popen(
            [
                *TOOLHOST,
                "invoke",
                *("--app-root", str(root), "echo.say", '{"text": "hi"}'),
                *("--approve", "kernel", "--timeout", "30000"),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            deadline = time.monotonic() + 30
            while True:
                out = cli(root, "status")
                assert out.returncode == 0, out.stderr
                m = re.search(r"^  (\S+)  echo.say \(sidecar echo\)", out.stdout, re.M)
                if m:
                    break
                assert time.monotonic() < deadline, out.stdout
                time.sleep(0.1)
            assert "waiting for approval (1):" in out.stdout
            assert 'input: {"text":"hi"}' in out.stdout
            listed = json.loads(cli(root, "status", "--json").stdout)["pendingApprovals"]
            assert [p["callId"] for p in listed] == [m.group(1)]
            nope = cli(root, "approve", "no-such-call")
            assert nope.returncode != 0 and "no call 'no-such-call'" in nope.stderr
            yes = cli(root, "approve", m.group(1), "--by", "alice")
            assert yes.returncode == 0 and f"approved {m.group(1)} (by alice)" in yes.stdout
            stdout, stderr = call.communicate(timeout=30)
        finally:
            if call.poll() is None:
                call.kill()
        assert call.returncode == 0, stderr
        assert json.loads(stdout)["status"] == "success"
        assert (root / ".toolhost" / "operator.token").stat().st_mode & 0o777 == 0o600


def test_restart_names_the_workers_and_fails_for_an_unknown_sidecar(tmp_path):
    root = tmp_path / "app"
    root.mkdir()
    write_registry(root, {"echo": echo(tools=["echo.say"])})
    with serve(root):
        deadline = time.monotonic() + 30
        while '"echo.say"' not in cli(root, "catalog", "--json").stdout or "available" not in (
            cli(root, "status").stdout
        ):
            assert time.monotonic() < deadline
            time.sleep(0.1)
        r = cli(root, "restart", "echo")
        assert r.returncode == 0, r.stderr
        assert re.search(r"restarted echo: replaced pid \d+", r.stdout)
        r = cli(root, "restart", "no-such-sidecar")
        assert r.returncode != 0 and "no running sidecar named 'no-such-sidecar'" in r.stderr


def test_status_and_logs_of_a_sidecar_that_has_no_process_or_output(tmp_path):
    """A first-time user's view: a oneshot sidecar between calls has no worker process, so its
    PIDS column says ``-`` (it said ``0``, a pid that does not exist); ``toolhost logs`` of a
    sidecar that has written nothing says so on stderr instead of printing an empty screen."""
    root = tmp_path / "app"
    root.mkdir()
    fly = script("flyflor", ["fly.echo"], protocol="process-json", mode="oneshot")
    write_registry(root, {"echo": echo(tools=["echo.say"]), "fly": fly})
    with serve(root):
        deadline = time.monotonic() + 30
        while True:
            out = cli(root, "status")
            rows = {line.split()[0]: line.split() for line in out.stdout.splitlines() if line}
            if rows.get("fly", [""])[1:2] == ["ready"] and rows.get("echo", [""])[1:2] == ["ready"]:
                break
            assert time.monotonic() < deadline, out.stdout
            time.sleep(0.1)
        assert rows["fly"][3] == "-", out.stdout  # WORKERS 1, PIDS -
        assert re.fullmatch(r"\d+", rows["echo"][3]) and rows["echo"][3] != "0", out.stdout
        r = cli(root, "logs", "echo")
        assert r.returncode == 0 and r.stdout == "", (r.stdout, r.stderr)
        assert "echo has written nothing to its stderr yet" in r.stderr
