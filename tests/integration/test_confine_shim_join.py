"""The exec shim's pids group join, done by the host (no zygote: ``TOOLHOST_SPAWN=exec``'s
path): the host writes the child's pid into its group from a thread while the shim's
interpreter starts, and the shim waits for the host's word, and checks ``/proc/self/cgroup``,
before anything of the worker runs or can fork.

Read back from the kernel: a worker whose first instruction reads its own group is in it, and a
fork bomb from its first instructions is bounded by the group; the shim sits blocked on its
channel until the host's join is done; a join the host could not make, or one it says it made
but did not, fails the start (``required``) with one clear line, or is reported (best-effort)."""

from __future__ import annotations

import contextlib
import errno
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import msgspec
import pytest
import trio

from supervisor.contracts.confine import Profile
from supervisor.processes.child import Child
from supervisor.processes.confine import SHIM_FAILED, SidecarWalls
from supervisor.processes.confine_spawn import Prepared, SidecarConfinement
from supervisor.processes.pids_cgroup import PidsCgroups
from supervisor.processes.spawn import Spawner, allowed_env, exec_child
from supervisor.processes.warden import process_warden
from tests.integration.confine_kit import KERNEL, World, make_world, need
from tests.integration.test_confine_spare import confined, in_group, need_groups, procs
from tests.integration.test_confine_zygote import first_line, stop

WORKER = """\
with open("/proc/self/cgroup") as f:
    cgroup = f.read()
import errno, json, os, signal, sys
children, outcome = [], "ok"
try:
    for _ in range(50):
        pid = os.fork()
        if pid == 0:
            signal.pause()
            os._exit(0)
        children.append(pid)
except OSError as exc:
    outcome = errno.errorcode[exc.errno]
for pid in children:
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
print(json.dumps({"cgroup": cgroup, "bomb": f"{outcome}:{len(children)}"}), flush=True)
sys.stdin.read()
"""

ENV = allowed_env(os.environ, {})


@pytest.fixture
def world(tmp_path: Path) -> World:
    w = make_world(tmp_path)
    (w.project / "worker.py").write_text(WORKER)  # project: read (the strict default)
    return w


def argv(world: World) -> list[str]:
    return [sys.executable, str(world.project / "worker.py")]


@pytest.mark.parametrize("form", ["python", "exec"])
async def test_a_shim_started_worker_is_in_its_group_from_its_first_instruction(
    world: World, form: str
) -> None:
    """Both shim forms: ``--python`` (the shim's interpreter runs the worker) and the shim's
    exec (a ``PYTHONPATH`` makes the host keep it: the worker's interpreter is exec'd)."""
    need_groups()
    plan = world.plan(Profile(processes=7))
    assert plan.pids == "cgroup"
    groups = PidsCgroups.probe(f"toolhost-test-{os.getpid()}")
    assert groups is not None
    env = ENV if form == "python" else {**ENV, "PYTHONPATH": str(world.root / "none")}
    with confined(plan, groups) as (confine, started):
        child = Spawner(None).spawn(argv(world), cwd=str(world.app), env=env, confine=confine)
        started.append(child)
        prepared = child.confinement
        assert prepared is not None and prepared.via == "shim" and prepared.by_host
        assert (prepared.why_exec == "") == (form == "python"), prepared.why_exec
        seen = await first_line(child)
        assert in_group(seen["cgroup"], prepared.cgroup), seen["cgroup"]
        outcome, count = seen["bomb"].split(":")
        assert outcome == "EAGAIN" and int(count) < plan.processes, seen["bomb"]
        assert procs(prepared.cgroup) == [child.pid]  # the shim is the worker: one process
        report = prepared.report()
        assert report is not None and report["errors"] == []
        assert report["pids"] == "cgroup" and report["joined_by_host"] is True
        assert report["joined_ahead"] is False
        assert prepared.facts(child.pid).missing == list(plan.missing)
        group = prepared.cgroup
        assert await stop(child) == 0
    assert not os.path.exists(group)


READ_SYSCALL = {"x86_64": "0", "aarch64": "63"}
"""``read``'s number, as ``/proc/<pid>/syscall`` shows the call a process sits in."""


def _blocked_reading(pid: int, fd: int) -> bool:
    """``pid`` sits in ``read(fd, ...)``."""
    try:
        with open(f"/proc/{pid}/syscall") as f:
            fields = f.read().split()
    except OSError:
        return False
    number = READ_SYSCALL[os.uname().machine]
    return len(fields) > 1 and fields[0] == number and int(fields[1], 16) == fd


async def test_the_shim_runs_nothing_of_the_worker_before_the_hosts_word(world: World) -> None:
    """The join held back: the shim waits on its channel, outside its group, the worker's first
    line not written; once the host's join is done the worker starts in its group."""
    need_groups()
    need(os.uname().machine in READ_SYSCALL, "x86_64 or aarch64 (the read syscall's number)")
    plan = world.plan(Profile(processes=7))
    groups = PidsCgroups.probe(f"toolhost-test-{os.getpid()}")
    assert groups is not None
    with confined(plan, groups) as (confine, started):
        prepared = confine.prepare(argv(world), cwd=str(world.app), env=ENV, host_join=True)
        assert prepared.by_host and prepared.why_exec == ""
        channel = prepared.inherited[-1]  # the walls' channel: the last descriptor they name
        child, join = _shim_child(world, prepared)
        prepared.via = "shim"
        prepared.started()
        child.confinement = prepared
        started.append(child)
        with trio.fail_after(30):  # no event to wait on: poll the kernel's view of the shim
            while not _blocked_reading(child.pid, channel):
                await trio.sleep(0.005)
        assert procs(prepared.cgroup) == []  # not in its group yet
        assert prepared.report() is None  # no wall went up: nothing reported
        await trio.to_thread.run_sync(join)
        seen = await first_line(child)
        assert in_group(seen["cgroup"], prepared.cgroup)
        assert seen["bomb"].startswith("EAGAIN:")
        report = prepared.report()
        assert report is not None and report["joined_by_host"] is True
        assert await stop(child) == 0


@contextlib.contextmanager
def not_a_hierarchy(world: World) -> Iterator[PidsCgroups]:
    """ "Groups" in a plain folder: the host's write of the pid fails (no ``cgroup.procs``), or
    lands in a plain file a test put there, and the process is in no such group. Works for any
    user: nothing here is a cgroup."""
    fake = PidsCgroups(str(world.root / "fake" / f"toolhost-test-{os.getpid()}"), 1)
    try:
        yield fake
    finally:  # remove the plain files first: PidsCgroups.remove would kill the pids they list
        for dirpath, _dirs, files in os.walk(world.root / "fake"):
            for name in files:
                os.unlink(os.path.join(dirpath, name))


def _confinement(world: World, fake: PidsCgroups, mode: str) -> SidecarConfinement:
    kernel = msgspec.structs.replace(KERNEL, pids_cgroup=True)
    plan = world.plan(Profile(processes=7), kernel=kernel, mode=mode)
    assert plan.pids == "cgroup" and plan.active
    return SidecarConfinement(plan, SidecarWalls(plan), fake)


def _shim_child(world: World, prepared: Prepared) -> tuple[Child, Callable[[], None]]:
    """The exec shim's child of ``prepared`` started, and the host's join of it (not run yet)."""
    child = exec_child(
        prepared.argv,
        cwd=str(world.app),
        env={**ENV, **prepared.env},
        warden=process_warden(),
        pass_fds=prepared.pass_fds,
    )
    join = prepared.host_join(child.pid)
    assert join is not None
    return child, join


async def _ended(child: Child) -> tuple[int, bytes, bytes]:
    assert child.stdout is not None and child.stderr is not None
    out = err = b""
    with trio.fail_after(30):
        while chunk := await child.stderr.receive_some(65536):
            err += chunk
        while chunk := await child.stdout.receive_some(65536):
            out += chunk
        rc = await child.wait()
    await child.aclose_streams()
    return rc, out, err


async def test_a_failed_host_join_fails_the_start_with_a_clear_error(world: World) -> None:
    need(KERNEL.landlock_abi >= 1, "Landlock")
    need(bool(KERNEL.seccomp and KERNEL.arch), "seccomp filters on x86_64/aarch64")
    with not_a_hierarchy(world) as fake:
        confine = _confinement(world, fake, "required")
        try:
            child = Spawner(None).spawn(argv(world), cwd=str(world.app), env=ENV, confine=confine)
            prepared = child.confinement
            assert prepared is not None and prepared.by_host
            rc, out, err = await _ended(child)
            prepared.finish(ended=True)
        finally:
            confine.close()
    assert rc == SHIM_FAILED and out == b""
    line = (
        "toolhost: confinement failed: pids cgroup: the host could not move this worker into"
        f" its group ({os.strerror(errno.ENOENT)})"
    )
    assert err.decode().strip() == line
    assert "Traceback" not in err.decode()


async def test_a_failed_host_join_under_best_effort_is_reported(world: World) -> None:
    """As a failed join in the child always was: the worker runs, and its facts say what is
    missing (no pids group), read from the walls' report."""
    with not_a_hierarchy(world) as fake:
        confine = _confinement(world, fake, "best-effort")
        try:
            child = Spawner(None).spawn(argv(world), cwd=str(world.app), env=ENV, confine=confine)
            prepared = child.confinement
            assert prepared is not None and prepared.by_host
            await first_line(child)
            report = prepared.report()
            missing = prepared.facts(child.pid).missing
            assert await stop(child) == 0
            prepared.finish(ended=True)
        finally:
            confine.close()
    assert report is not None and report["pids"] == "none"
    assert report["joined_by_host"] is False
    assert any(m.startswith("pids cgroup: the host could not move") for m in missing), missing


async def test_the_shim_checks_its_group_rather_than_trusting_the_host(world: World) -> None:
    """The host's write "succeeds" (into a plain file) and its word says so; the shim reads
    ``/proc/self/cgroup``, is in no such group, and refuses to run the worker."""
    need(KERNEL.landlock_abi >= 1, "Landlock")
    need(bool(KERNEL.seccomp and KERNEL.arch), "seccomp filters on x86_64/aarch64")
    with not_a_hierarchy(world) as fake:
        confine = _confinement(world, fake, "required")
        try:
            prepared = confine.prepare(argv(world), cwd=str(world.app), env=ENV, host_join=True)
            Path(prepared.cgroup, "cgroup.procs").write_text("")
            child, join = _shim_child(world, prepared)
            prepared.started()
            await trio.to_thread.run_sync(join)
            rc, out, err = await _ended(child)
            written = Path(prepared.cgroup, "cgroup.procs").read_text()
            Path(prepared.cgroup, "cgroup.procs").unlink()
            prepared.finish(ended=True)
        finally:
            confine.close()
    assert written == str(child.pid)  # the host did write it
    assert rc == SHIM_FAILED and out == b""
    text = err.decode().strip()
    assert text.startswith("toolhost: confinement failed: pids cgroup: not in its group "), text
    assert text.endswith(" after the host's join") and "Traceback" not in text
