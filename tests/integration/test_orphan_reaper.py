"""The zygote's orphan reaper (docs/zygote.md): the host is a child subreaper, so it reaps the
orphans it adopts, and never a child something in the host waits for.

The bug these hold down (issue 28, the zygote's spare): the reaper read ``tty_nr`` from
``/proc/<pid>/stat`` as the session, so it reaped every zombie child of the host, its own
workers too; a worker reaped there lost its exit status (its ``Child`` got ``ECHILD``, reported
as SIGKILL). With spares on, the zygote's task, which runs the reaper, wakes right after every
confined start (the next spare is wanted), just when a per-call worker exits: a Fractalic
script that exits 4 was reported ``worker-crashed`` by SIGKILL. The first test drives that
interleaving with the zygote's own task and events, no timing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import trio
import trio.testing

from supervisor.processes import linux, zygote
from supervisor.processes.child import Child
from supervisor.processes.spawn import allowed_env, exec_child
from supervisor.processes.warden import process_warden
from tests.integration.test_confine_zygote import running_zygote

# The reaper needs what the zygote needs (Linux, prctl); under CI=true a platform without it
# fails instead of skipping. TOOLHOST_SPAWN=exec turns the zygote (and so the reaper) off.
pytestmark = pytest.mark.skipif(
    zygote.platform_problem() is not None and os.environ.get("CI") != "true",
    reason=f"no zygote here: {zygote.platform_problem()}",
)

ENV = allowed_env(os.environ, {})


def exits_4(folder: Path) -> Child:
    """An exec'd worker (a session of its own) that exits 4 at once."""
    return exec_child(
        [sys.executable, "-c", "raise SystemExit(4)"],
        cwd=str(folder),
        env=ENV,
        stdin=False,
        stdout=False,
        stderr=False,
        warden=process_warden(),
    )


async def exited(pid: int) -> None:
    """Until ``pid`` has exited (its pidfd is readable); nothing is reaped by waiting."""
    fd = os.pidfd_open(pid)
    try:
        await trio.lowlevel.wait_readable(fd)
    finally:
        os.close(fd)


def state(pid: int) -> str:
    """``/proc/<pid>/stat``'s state letter ("" once the pid is reaped)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return ""


@pytest.mark.skipif(zygote.forced_exec(), reason="TOOLHOST_SPAWN=exec: no zygote")
async def test_a_worker_that_exited_keeps_its_status_when_the_zygote_wakes_first(tmp_path):
    script = tmp_path / "exit4.py"
    script.write_text("raise SystemExit(4)\n")
    async with running_zygote(tmp_path, reply_timeout_s=5.0) as z:
        child, why = z.fork([sys.executable, str(script)], cwd=str(tmp_path), env=ENV, limits=())
        assert child is not None and child.started_by == "zygote", why
        await exited(child.pid)
        assert state(child.pid) == "Z"  # exited; its Child has not reaped it yet
        # What a confined start that takes the spare does: the next spare is wanted, so the
        # zygote's task wakes, reaps orphans and asks for it (no pids groups here: no spare).
        z.spare.wanted.set()
        await trio.testing.wait_all_tasks_blocked()
        assert not z.spare.wanted.is_set()  # the task ran (request() made a fresh event)
        assert state(child.pid) == "Z"  # left to its Child
        assert await child.wait() == 4
        child.forget()


async def test_only_orphans_are_reaped_whatever_their_session(tmp_path):
    # A worker (its own session) and a child in the host's session (a Popen), both exited and
    # not yet reaped: their owners learn their statuses. An orphan the host adopted that leads
    # a session of its own (a task keeper whose worker ended) is reaped.
    worker = exits_4(tmp_path)
    popen = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    r, w = os.pipe()
    assert linux.set_subreaper(True) is None
    try:
        parent = subprocess.Popen(
            [
                sys.executable,
                "-c",
                "import os, sys\n"
                "pid = os.fork()\n"
                "if pid == 0:\n"
                "    os.setsid(); os.read(int(sys.argv[1]), 1); os._exit(5)\n"
                "print(pid, flush=True)\n",
                str(r),
            ],
            pass_fds=(r,),
            stdout=subprocess.PIPE,
        )
        os.close(r)
        assert parent.stdout is not None
        orphan = int(parent.stdout.readline())  # blocked on the pipe
        parent.stdout.close()
        assert parent.wait() == 0  # so the orphan is ours now (we are a subreaper)
        assert f"PPid:\t{os.getpid()}\n" in Path(f"/proc/{orphan}/status").read_text()
        os.close(w)  # the orphan reads EOF and exits
        for pid in (worker.pid, popen.pid, orphan):
            await exited(pid)
            assert state(pid) == "Z"
        assert linux.reap_orphans() >= 1
        assert state(orphan) == ""
        assert state(worker.pid) == state(popen.pid) == "Z"
        assert await worker.wait() == 4
        assert popen.wait() == 3
        worker.forget()
    finally:
        linux.set_subreaper(False)


async def test_a_lost_exit_status_is_said(tmp_path, caplog):
    """A worker reaped by anything but its ``Child`` (the bug the reaper had) is reported as
    killed, and the host log says its status was lost, so the next such bug shows."""
    worker = exits_4(tmp_path)
    await exited(worker.pid)
    os.waitpid(worker.pid, 0)  # someone else takes it
    with caplog.at_level("WARNING", logger="toolhost.workers"):
        assert await worker.wait() == -9
    assert f"worker {worker.pid}: its exit status was lost" in caplog.text
