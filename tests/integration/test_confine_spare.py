"""The zygote's spare (issue 28): the next confined worker's pids group is joined ahead by a
fresh fork of the zygote, so the worker's start does not wait for a cgroup migration.

Read back from the kernel: before the request the spare is alone in its empty group
(``pids.max`` 1), a child of the zygote holding none of the previous worker's descriptors; the
worker started from it runs in that group with the plan's limit and nothing else there, its
walls report the group; the next spare is made in a group of its own; when the zygote stops and
the workers end, every group is gone, the host's folder of groups with them."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import trio

from supervisor.contracts.confine import ConfinePlan, Profile
from supervisor.processes import zygote
from supervisor.processes.child import Child
from supervisor.processes.confine import SidecarWalls
from supervisor.processes.confine_spawn import SidecarConfinement
from supervisor.processes.pids_cgroup import PidsCgroups
from supervisor.processes.spawn import Spawner, allowed_env
from tests.conftest import running_host, wait_available
from tests.integration.confine_kit import KERNEL, ROOT, World, make_world, need
from tests.integration.test_confine_host import TOOL, entry
from tests.integration.test_confine_host import world as host_world
from tests.integration.test_confine_zygote import first_line, running_zygote, stop


@pytest.fixture(autouse=True)
def _spares_default(monkeypatch: pytest.MonkeyPatch) -> None:
    """Spares are on by default (``Zygote.take_spare``): these tests run with the default, even
    where the environment turned them off (``TOOLHOST_ZYGOTE_SPARE=0``)."""
    monkeypatch.delenv("TOOLHOST_ZYGOTE_SPARE", raising=False)


pytestmark = pytest.mark.skipif(
    zygote.forced_exec() or zygote.platform_problem() is not None,
    reason=f"no zygote: {zygote.platform_problem() or 'TOOLHOST_SPAWN=exec'}",
)

WORKER = """\
import json, sys
with open("/proc/self/cgroup") as f:
    print(json.dumps({"cgroup": f.read()}), flush=True)
sys.stdin.read()
"""

ENV = allowed_env(os.environ, {})


def need_groups() -> None:
    """Root must have a pids cgroup (in CI too); a normal user has none to join ahead."""
    need(KERNEL.pids_cgroup or not ROOT, "a writable pids cgroup (root ignores RLIMIT_NPROC)")
    if not KERNEL.pids_cgroup:
        pytest.skip("a normal user without a delegated pids cgroup gets RLIMIT_NPROC: no group")


@pytest.fixture
def world(tmp_path: Path) -> World:
    return make_world(tmp_path)


@contextmanager
def confined(
    plan: ConfinePlan, groups: PidsCgroups | None
) -> Iterator[tuple[SidecarConfinement, list[Child]]]:
    """The sidecar's walls, and the workers started behind them: their groups are removed even
    when an assertion failed before a worker was stopped."""
    confine = SidecarConfinement(plan, SidecarWalls(plan), groups)
    started: list[Child] = []
    try:
        yield confine, started
    finally:
        for child in started:
            if child.confinement is not None:
                child.confinement.finish()  # kills what is left in its group, removes it
        confine.close()
        if groups is not None:
            groups.close()


def procs(group: str) -> list[int]:
    with open(os.path.join(group, "cgroup.procs")) as f:
        return [int(p) for p in f.read().split()]


def pids_max(group: str) -> str:
    with open(os.path.join(group, "pids.max")) as f:
        return f.read().strip()


def parent(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def targets(pid: int) -> set[str]:
    """What the descriptors of ``pid`` point at (``pipe:[n]``, ``/memfd:...``)."""
    out = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            out.add(os.readlink(f"/proc/{pid}/fd/{fd}"))
        except OSError:
            continue
    return out


def in_group(cgroup_file: str, group: str) -> bool:
    """Whether a ``/proc/<pid>/cgroup`` text puts the process's pids group at ``group``."""
    for line in cgroup_file.splitlines():
        _num, controllers, path = line.split(":", 2)
        pids = "pids" in controllers.split(",") or controllers == ""  # v1 or v2
        if pids and path != "/" and group.endswith(path):
            return True
    return False


@pytest.mark.parametrize("run", [True, False], ids=["forked", "exec"])
async def test_a_confined_worker_starts_in_the_group_its_spare_joined(
    world: World, run: bool
) -> None:
    need_groups()
    script = world.project / "worker.py"
    script.write_text(WORKER)
    plan = world.plan(Profile(processes=7))
    assert plan.pids == "cgroup"
    groups = PidsCgroups.probe(f"toolhost-test-{os.getpid()}")
    assert groups is not None
    argv = [sys.executable, str(script)]
    with confined(plan, groups) as (confine, started):
        async with running_zygote(world.app) as z:
            spawner = Spawner(z)

            def start() -> Child:
                child = spawner.spawn(
                    argv, cwd=str(world.app), env=ENV, may_fork=run, confine=confine
                )
                started.append(child)
                return child

            first = start()  # no spare yet: a fresh group, joined by the worker itself
            assert first.confinement is not None and first.confinement.via == "zygote"
            first_group = first.confinement.cgroup
            assert in_group((await first_line(first))["cgroup"], first_group)
            report = first.confinement.report()
            assert report is not None and report["pids"] == "cgroup"
            assert report["joined_ahead"] is False  # it migrated into its group itself
            with trio.fail_after(15):
                await z.spare.joined.wait()
            assert z.spare.made is not None and z.spare.pid is not None
            spare_group, spare_pid = z.spare.made[1], z.spare.pid
            assert spare_group != first_group
            # Before the request: the spare alone in its group, which allows nothing more; a
            # child of the zygote (a fresh fork) holding nothing of the first worker's.
            assert procs(spare_group) == [spare_pid]
            assert pids_max(spare_group) == "1"
            assert parent(spare_pid) == z.pid
            first_ends = {t for t in targets(first.pid) if t.startswith(("pipe:", "/memfd:"))}
            assert first_ends and not first_ends & targets(spare_pid)

            second = start()
            prepared = second.confinement
            assert prepared is not None and prepared.via == "zygote"
            assert second.started_by == ("zygote" if run else "exec")
            assert prepared.cgroup == spare_group  # the spare's group is the worker's now
            seen = await first_line(second)
            assert in_group(seen["cgroup"], spare_group)
            assert procs(spare_group) == [second.pid]  # the spare is gone from it
            assert pids_max(spare_group) == "7"  # the plan's limit
            report = prepared.report()
            assert report is not None and report["pids"] == "cgroup" and report["errors"] == []
            assert report["joined_ahead"] is True  # forked inside it: no migration
            # The next spare, in a group of its own.
            with trio.fail_after(15):
                await z.spare.joined.wait()
            assert z.spare.made is not None
            next_group = z.spare.made[1]
            assert next_group not in (first_group, spare_group) and os.path.isdir(next_group)
            assert (await stop(first), await stop(second)) == (0, 0)
        assert not os.path.exists(next_group)  # the untaken spare's group: at zygote stop
        assert not os.path.exists(first_group) and not os.path.exists(spare_group)
    assert not os.path.exists(groups.base)  # nothing left: the folder is removed only empty


async def test_a_spare_killed_before_the_request_leaves_the_start_to_the_zygote(
    world: World,
) -> None:
    """The zygote finds its spare gone: it forks the worker the usual way, and the worker
    joins the group itself (the one the dead spare had joined)."""
    need_groups()
    script = world.project / "worker.py"
    script.write_text(WORKER)
    plan = world.plan(Profile(processes=7))
    groups = PidsCgroups.probe(f"toolhost-test-{os.getpid()}")
    assert groups is not None
    argv = [sys.executable, str(script)]
    with confined(plan, groups) as (confine, started):
        async with running_zygote(world.app) as z:
            spawner = Spawner(z)
            first = spawner.spawn(argv, cwd=str(world.app), env=ENV, may_fork=True, confine=confine)
            started.append(first)
            await first_line(first)
            with trio.fail_after(15):
                await z.spare.joined.wait()
            assert z.spare.made is not None and z.spare.pid is not None
            spare_group = z.spare.made[1]
            pidfd = os.pidfd_open(z.spare.pid)
            try:
                os.kill(z.spare.pid, signal.SIGKILL)
                with trio.fail_after(15):
                    await trio.lowlevel.wait_readable(pidfd)  # it has exited
            finally:
                os.close(pidfd)
            second = spawner.spawn(
                argv, cwd=str(world.app), env=ENV, may_fork=True, confine=confine
            )
            started.append(second)
            prepared = second.confinement
            assert prepared is not None and second.started_by == "zygote"
            assert prepared.cgroup == spare_group
            seen = await first_line(second)
            assert in_group(seen["cgroup"], spare_group)
            assert procs(spare_group) == [second.pid] and pids_max(spare_group) == "7"
            report = prepared.report()
            assert report is not None and report["pids"] == "cgroup"
            assert report["joined_ahead"] is False  # it migrated into the group itself
            assert (await stop(first), await stop(second)) == (0, 0)
    assert not os.path.exists(groups.base)


@pytest.mark.parametrize("why", ["one process", "no groups", "turned off"])
async def test_a_start_takes_no_spare_when_it_could_not_use_one(
    world: World, why: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``processes: 1`` leaves the spare no room to fork the worker inside the group: each
    worker joins a fresh group of its own, as without spares. A host without pids groups
    (a normal user's ``RLIMIT_NPROC``) has no group to join ahead: no spare either. Nor with
    ``TOOLHOST_ZYGOTE_SPARE=0`` in the host's environment."""
    script = world.project / "worker.py"
    script.write_text(WORKER)
    groups = None
    if why != "no groups":
        need_groups()
        groups = PidsCgroups.probe(f"toolhost-test-{os.getpid()}")
        assert groups is not None
    if why == "turned off":
        monkeypatch.setenv("TOOLHOST_ZYGOTE_SPARE", "0")
    limit = 1 if why == "one process" else 7
    plan = world.plan(Profile(processes=limit))
    with confined(plan, groups) as (confine, children):
        async with running_zygote(world.app) as z:
            spawner = Spawner(z)
            for _ in range(2):
                child = spawner.spawn(
                    [sys.executable, str(script)],
                    cwd=str(world.app),
                    env=ENV,
                    may_fork=True,
                    confine=confine,
                )
                children.append(child)
                assert child.confinement is not None
                seen = await first_line(child)
                group = child.confinement.cgroup
                if groups is not None:
                    assert in_group(seen["cgroup"], group) and pids_max(group) == str(limit)
                    report = child.confinement.report()
                    assert report is not None and report["joined_ahead"] is False
                else:
                    assert group == ""
            assert z.spare.made is None and z.spare.cgroups is None
            assert [await stop(c) for c in children] == [0, 0]
    assert groups is None or not os.path.exists(groups.base)


async def test_a_stopped_host_leaves_no_spare_and_no_group(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    need_groups()
    w = host_world(tmp_path, monkeypatch)
    mine = PidsCgroups.probe()  # this process's folder of worker groups: the in-process host's
    assert mine is not None
    tool = TOOL["persistent"]
    sidecars = {"hostile": entry("persistent")}
    async with running_host(w["app"], sidecars, host={"confinement": "best-effort"}) as host:
        await wait_available(host, tool, timeout=40)
        z = host.zygote
        assert z is not None and z.state == "ready"
        with trio.fail_after(15):
            await z.spare.joined.wait()  # the worker's start asked for the next spare
        assert z.spare.made is not None and z.spare.pid is not None
        spare_group = z.spare.made[1]
        assert os.path.dirname(spare_group) == mine.base
        assert procs(spare_group) == [z.spare.pid]
    assert not os.path.exists(spare_group)
    assert not os.path.exists(mine.base)  # every worker's group too (removed only when empty)
