"""The host's temp folder (``processes/host_temp.py``): its confined workers' private
``TMPDIR`` s live in one folder per host, which a host killed with SIGKILL leaves behind and the
next host to start removes; a host that stops removes its own."""

import os
import signal
from pathlib import Path

import pytest
import trio

from supervisor.processes.confine import probe
from tests.conftest import echo, write_registry
from tests.e2e.conftest import serve
from tests.e2e.test_serve import wait_visible

pytestmark = pytest.mark.skipif(
    probe().landlock_abi == 0 and os.environ.get("CI") != "true",
    reason="no Landlock on this kernel: nothing is confined, no temp folder is made",
)


def host_folders(tmp: Path) -> list[Path]:
    return sorted(p for p in tmp.iterdir() if p.name.startswith("toolhost-"))


def test_a_killed_hosts_temp_folder_is_removed_by_the_next_host(tmp_path: Path) -> None:
    root, tmp = tmp_path / "app", tmp_path / "t"
    root.mkdir()
    tmp.mkdir()
    write_registry(root, {"echo": echo(pool={"min": 2, "max": 2})})
    env = {"TMPDIR": str(tmp)}
    sock = root / ".toolhost" / "host.sock"
    with serve(root, env=env) as first:
        trio.run(wait_visible, sock, ["echo.say"])
        [killed] = host_folders(tmp)
        assert killed.name.startswith(f"toolhost-{first.pid}-")
        [sidecar] = [p for p in killed.iterdir() if p.is_dir()]
        assert sidecar.name.startswith("echo-")
        # A worker's private TMPDIR is below it (the pool's workers start one by one).
        workers = list(sidecar.iterdir())
        assert workers and all(w.name.startswith("w-") for w in workers)
        (workers[0] / "left-by-a-worker").write_text("x")
        os.kill(first.pid, signal.SIGKILL)
        first.wait()
    assert host_folders(tmp) == [killed]  # SIGKILL: nobody removed it
    with serve(root, env=env) as second:
        trio.run(wait_visible, sock, ["echo.say"])
        [live] = host_folders(tmp)  # the dead host's is gone, this host's is there
        assert live != killed and live.name.startswith(f"toolhost-{second.pid}-")
    assert host_folders(tmp) == []  # a host that stops removes its own
