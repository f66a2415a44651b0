"""task.background tasks end with the host process (no orphans) unless ``config.detach``; the
same confined (``host.confinement: best-effort``: the utility family's ``confine.keep: host``
lets a detached task's keeper outlive the host)."""

from __future__ import annotations

import json
import os
import signal
import textwrap
import time
from pathlib import Path

import pytest

from tests.conftest import REPO, pid_alive
from tests.e2e.conftest import cli, serve

TICKER = textwrap.dedent(
    """\
    import subprocess, sys, time
    child = subprocess.Popen([sys.executable, "-c",
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(120)"])
    print("grandchild", child.pid, flush=True)
    for i in range(2000):
        print("line", i, flush=True)
        time.sleep(0.05)
    """
)


CONFINEMENT = ["off", "best-effort"]


def write_app(root: Path, detach: bool, confinement: str) -> None:
    (root / "tools").mkdir(parents=True)
    (root / "workspace").mkdir()
    (root / "workspace" / "ticker.py").write_text(TICKER)
    registry = {
        "schemaVersion": 2,
        "host": {"socket": ".toolhost/host.sock", "confinement": confinement},
        "sidecars": {
            "utility": {
                "command": "python",
                "args": ["-m", "sidecars.utility"],
                "tools": ["task.background"],
                "config": {"taskCommand": ["python", "ticker.py"], "detach": detach},
                "pool": {"min": 1, "max": 1},
            }
        },
    }
    (root / "tools" / "external.tools.jsonc").write_text(json.dumps(registry))


def start_task(root: Path) -> tuple[int, int]:
    """Start a ticker task through the CLI; return the keeper's pid and the grandchild's."""
    deadline = time.monotonic() + 60
    while True:
        out = cli(
            root,
            "invoke",
            "task.background",
            '{"action": "start"}',
            "--approve",
            "test",
            "--timeout",
            "20000",
        )
        env = json.loads(out.stdout)
        # `serve` logs "serving" before the utility worker is ready (runtime: starting).
        starting = env["status"] == "unavailable" and env["error"]["code"] == "not-visible"
        if not starting or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert env["status"] == "success", out.stdout + out.stderr
    task_id, keeper = env["data"]["id"], env["data"]["pid"]
    log = root / "workspace" / ".toolhost" / "tasks" / task_id / "stdout.log"
    deadline = time.monotonic() + 30
    while "grandchild" not in (log.read_text() if log.exists() else ""):
        assert time.monotonic() < deadline, "the task never printed"
        time.sleep(0.05)
    grandchild = int(log.read_text().split("grandchild ", 1)[1].split()[0])
    return keeper, grandchild


def wait_gone(*pids: int, timeout: float = 30) -> bool:
    deadline = time.monotonic() + timeout
    while any(pid_alive(p) for p in pids):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


@pytest.mark.parametrize("confinement", CONFINEMENT)
@pytest.mark.parametrize("how", ["sigterm", "sigkill"])
def test_tasks_die_with_the_host(tmp_path: Path, how: str, confinement: str) -> None:
    root = tmp_path / "app"
    write_app(root, detach=False, confinement=confinement)
    with serve(root, "--no-global", env={"PYTHONPATH": str(REPO)}) as proc:
        keeper, grandchild = start_task(root)
        assert pid_alive(keeper) and pid_alive(grandchild)
        proc.send_signal(signal.SIGTERM if how == "sigterm" else signal.SIGKILL)
        proc.wait(timeout=20)
    assert wait_gone(keeper, grandchild), "a task outlived the host"


@pytest.mark.parametrize("confinement", CONFINEMENT)
def test_detached_tasks_outlive_the_host(tmp_path: Path, confinement: str) -> None:
    root = tmp_path / "app"
    write_app(root, detach=True, confinement=confinement)
    with serve(root, "--no-global", env={"PYTHONPATH": str(REPO)}) as proc:
        keeper, grandchild = start_task(root)
        proc.terminate()
        proc.wait(timeout=20)
    try:
        time.sleep(0.5)  # give a wrongly attached keeper the time to react
        assert pid_alive(keeper) and pid_alive(grandchild)
    finally:
        os.killpg(keeper, signal.SIGKILL)
    assert wait_gone(keeper, grandchild)
