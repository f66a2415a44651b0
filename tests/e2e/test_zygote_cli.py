"""The zygote through the real ``toolhost`` command: status and doctor show it, and SIGKILL of
the host leaves neither the zygote nor a worker it forked."""

import json
import os
import signal

import psutil
import pytest
import trio

from supervisor.processes import zygote
from tests.conftest import echo, pid_alive, write_registry
from tests.e2e.conftest import cli, serve
from tests.e2e.test_serve import wait_visible

pytestmark = pytest.mark.skipif(
    zygote.forced_exec()
    or (zygote.platform_problem() is not None and os.environ.get("CI") != "true"),
    reason=f"zygote unavailable: {zygote.platform_problem() or 'TOOLHOST_SPAWN=exec'}",
)
PATIENT = {"zygote": {"replyTimeoutMs": 1000}}


def test_status_shows_the_zygote_and_sigkill_of_the_host_leaves_nothing(tmp_path):
    root = tmp_path / "app"
    root.mkdir()
    write_registry(root, {"echo": echo(pool={"min": 3, "max": 3})}, host=PATIENT)
    with serve(root) as proc:
        sock = root / ".toolhost" / "host.sock"
        trio.run(wait_visible, sock, ["echo.say"])
        data = json.loads(cli(root, "status", "--json").stdout)
        z = data["zygote"]
        assert z["state"] == "ready" and z["preloaded"] == ["sidecars.sdk"]
        zpid = z["pid"]
        text = cli(root, "status").stdout
        assert f"zygote: ready, pid {zpid}" in text
        # Wait until all three workers are up (the catalog is visible after the first).
        for _ in range(300):
            data = json.loads(cli(root, "status", "--json").stdout)
            ws = next(s for s in data["sidecars"] if s["id"] == "echo")["workers"]
            if len(ws) == 3 and all(w["state"] == "ready" for w in ws):
                break
        assert [w["startedBy"] for w in ws] == ["zygote"] * 3
        assert all(w["startMs"] > 0 for w in ws)
        pids = [w["pid"] for w in ws]
        # Adopted: the host is every worker's parent, the zygote is nobody's.
        assert all(psutil.Process(p).ppid() == proc.pid for p in pids)
        # Its one child, if any, is the spare it keeps for the next confined start (confinement
        # is on by default: docs/confinement.md, "The zygote's spare"), never a worker.
        spares = [p.pid for p in psutil.Process(zpid).children()]
        assert len(spares) <= 1 and not set(spares) & set(pids), (spares, pids)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        procs = []
        for pid in [*pids, zpid, *spares]:
            try:
                procs.append(psutil.Process(pid))
            except psutil.NoSuchProcess:
                pass
        _gone, alive = psutil.wait_procs(procs, timeout=10)
        assert alive == [], f"left behind: {[p.pid for p in alive]}"
        assert not any(pid_alive(p) for p in [*pids, zpid, *spares])


def test_doctor_names_the_zygote(tmp_path):
    root = tmp_path / "app"
    root.mkdir()
    write_registry(root, {"echo": echo()}, host=PATIENT)
    out = cli(root, "doctor")
    assert "zygote: ready, pid" in out.stdout, out.stdout
    write_registry(root, {"echo": echo()}, host={"zygote": {"enabled": False}})
    out = cli(root, "doctor")
    assert "zygote: off (host.zygote.enabled is false)" in out.stdout, out.stdout
