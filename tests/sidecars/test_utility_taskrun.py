"""The task keeper's ``control`` FIFO (``sidecars/utility/taskrun.py``): ``cancel`` asks the
keeper, which stops its own group (the way a restarted confined worker, in another Landlock
domain, still cancels; through a host: tests/integration/test_lsp_task.py), and a ``control``
that is not the keeper's FIFO is never written."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from sidecars.utility.taskrun import CONTROL
from sidecars.utility.tasks import KEEPER, _ask_keeper
from tests.conftest import pid_alive


def wait_until(pred: Callable[[], bool], timeout: float = 10) -> None:
    """The keeper makes its FIFO and ends without an event to wait on: poll."""
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_cancel_through_the_fifo_stops_the_group_and_records_it(tmp_path: Path) -> None:
    keeper = subprocess.Popen(
        [sys.executable, KEEPER, str(tmp_path), "0", "--", "sleep", "60"],
        start_new_session=True,
    )
    try:
        fifo = tmp_path / CONTROL
        wait_until(lambda: fifo.exists())
        assert stat.S_ISFIFO(fifo.stat().st_mode)
        assert _ask_keeper(tmp_path, 200)
        assert keeper.wait(timeout=10) == 0
        doc = json.loads((tmp_path / "exit.json").read_text())
        assert doc["reason"] == "cancelled" and doc["signal"] == 15
        assert not fifo.exists()  # removed: a later cancel finds no keeper
        assert not _ask_keeper(tmp_path, 200)
    finally:
        if keeper.poll() is None:
            os.killpg(keeper.pid, 9)
            keeper.wait()
    assert not pid_alive(keeper.pid)


def test_a_control_that_is_not_a_fifo_is_never_written(tmp_path: Path) -> None:
    planted = tmp_path / CONTROL
    planted.write_text("keep me")
    assert not _ask_keeper(tmp_path, 200)
    assert planted.read_text() == "keep me"
    target = tmp_path / "target.txt"
    target.write_text("keep me too")
    planted.unlink()
    planted.symlink_to(target)
    assert not _ask_keeper(tmp_path, 200)
    assert target.read_text() == "keep me too"
