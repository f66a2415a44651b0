"""``confine.keep`` and what was issued to one worker alone (the shared egress proxy's token in
its proxy URL, ``SidecarConfinement.worker_env``): processes kept after their worker ended
inherited that URL, so the token stays valid while they may run (as a sidecar's namespace
listener stays served for them) and dies when the kept group goes; a worker that left nothing
behind gives its token back when it ends."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import trio

from supervisor.contracts.confine import Profile
from supervisor.processes.confine import SidecarWalls
from supervisor.processes.confine_spawn import SidecarConfinement
from supervisor.processes.pids_cgroup import KeptGroups, PidsCgroups
from supervisor.processes.spawn import Spawner, allowed_env
from tests.conftest import pid_alive
from tests.integration.confine_kit import KERNEL, ROOT, World, make_world, need

LEAVE = """\
import os, sys
pid = os.fork()
if pid == 0:
    os.setsid()  # out of the worker's process group: only its pids group holds it
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.execvp("sleep", ["sleep", "120"])
print(pid if sys.argv[1] == "leave" else 0, flush=True)
if sys.argv[1] != "leave":
    os.kill(pid, 9)
    os.waitpid(pid, 0)
"""


@pytest.fixture
def world(tmp_path: Path) -> World:
    need(KERNEL.pids_cgroup or not ROOT, "a writable pids cgroup (root ignores RLIMIT_NPROC)")
    if not KERNEL.pids_cgroup:
        pytest.skip("a normal user without a delegated pids cgroup: no group to keep")
    w = make_world(tmp_path)
    (w.project / "leave.py").write_text(LEAVE)
    return w


Issued = dict[str, list[str]]


@contextmanager
def kept_sidecar(world: World) -> Iterator[tuple[SidecarConfinement, KeptGroups, Issued]]:
    plan = world.plan(Profile(keep="sidecar"))
    assert plan.pids == "cgroup", plan
    groups = PidsCgroups.probe(f"toolhost-test-{os.getpid()}")
    assert groups is not None
    kept = KeptGroups(groups)
    issued: Issued = {"issued": [], "undone": []}

    def issue(worker: str) -> tuple[dict[str, str], Callable[[], None]]:
        issued["issued"].append(worker)
        return {"HTTPS_PROXY": f"http://toolhost:{worker}@127.0.0.1:9"}, lambda: issued[
            "undone"
        ].append(worker)

    confine = SidecarConfinement(plan, SidecarWalls(plan), groups, worker_env=issue, kept=kept)
    try:
        yield confine, kept, issued
    finally:
        kept.close()
        confine.close()
        groups.close()


async def run_worker(world: World, confine: SidecarConfinement, how: str) -> int:
    """Start the worker, let it end; the pid of what it left (0: nothing)."""
    argv = [sys.executable, str(world.project / "leave.py"), how]
    child = Spawner(None).spawn(
        argv, cwd=str(world.app), env=allowed_env(os.environ, {}), confine=confine
    )
    assert child.stdout is not None
    out = b""
    with trio.fail_after(30):
        while chunk := await child.stdout.receive_some(4096):
            out += chunk
        assert await child.wait() == 0  # reaped: its confinement finished, keep applied
    await child.aclose_streams()
    return int(out)


async def test_a_kept_process_keeps_its_workers_proxy_token_until_the_group_goes(
    world: World,
) -> None:
    with kept_sidecar(world) as (confine, kept, issued):
        left = await run_worker(world, confine, "leave")
        assert left > 0 and pid_alive(left)
        assert len(issued["issued"]) == 1
        assert issued["undone"] == []  # it still runs with the token in its environment
        kept.release(confine.plan.sidecar)
        assert issued["undone"] == issued["issued"]
        with trio.fail_after(10):
            while pid_alive(left):
                await trio.sleep(0.01)


async def test_a_worker_that_left_nothing_gives_its_token_back(world: World) -> None:
    with kept_sidecar(world) as (confine, _kept, issued):
        assert await run_worker(world, confine, "stay") == 0
        assert issued["undone"] == issued["issued"] and len(issued["issued"]) == 1
