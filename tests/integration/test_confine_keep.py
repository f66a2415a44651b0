"""``confine.keep``: a confined worker's leftover processes (started in a session of their own,
so killing its process group misses them) die with its pids group unless its profile grants
``keep``; with ``sidecar`` they move to the sidecar's kept group, which the host empties when
the sidecar leaves the registry or the host stops; with ``host`` that group outlives the host.
Real processes through the real host (the hostile test sidecar's ``leave`` attack)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import msgspec
import pytest
import trio

from supervisor.calls.call import InvokeRequest
from supervisor.cli import doctor_confine
from supervisor.processes.pids_cgroup import KEPT_PREFIX, PidsCgroups
from tests.conftest import (
    pid_alive,
    raw,
    ready_pids,
    running_host,
    wait_available,
    wait_replaced,
    write_registry,
)
from tests.integration.confine_kit import HOSTILE, KERNEL, need

SIDECAR = str(HOSTILE.parent / "hostile_sidecar.py")
TOOL = "hostile.attack"


def entry(**confine: Any) -> dict[str, Any]:
    return {
        "command": "python",
        "args": [SIDECAR],
        "tools": [TOOL],
        "pool": {"min": 1, "max": 1},
        "restart": {"backoffMs": 20, "maxBackoffMs": 200},
        "confine": confine,
    }


def sidecars(**confine: Any) -> dict[str, Any]:
    return {"hostile": entry(**confine)}


HOST = {"confinement": "best-effort"}


def pids_group(pid: int) -> str:
    """The pids cgroup path of ``pid`` ("" when gone): cgroup v1's pids line, else v2's."""
    try:
        with open(f"/proc/{pid}/cgroup", encoding="ascii") as f:
            lines = f.read().splitlines()
    except OSError:
        return ""
    found = ""
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if "pids" in controllers.split(","):
            return path
        if controllers == "":
            found = path
    return found


def folder_of(group: str) -> str:
    """The folder of the pids cgroup ``group`` (a path from ``/proc/<pid>/cgroup``)."""
    for mount in ("/sys/fs/cgroup/pids", "/sys/fs/cgroup", "/sys/fs/cgroup/unified"):
        path = os.path.join(mount, group.lstrip("/"))
        if group and os.path.isfile(os.path.join(path, "pids.max")):
            return path
    return ""


async def leave(host: Any, count: int = 1) -> list[int]:
    """Have the worker start ``count`` sleepers in sessions of their own; their pids."""
    payload = {"attacks": {"leave": {"kind": "leave", "count": count}}}
    env = await host.invoker.invoke(InvokeRequest(TOOL, raw(payload)))
    assert env.status == "success", (env.status, env.content, env.error)
    got = msgspec.json.decode(env.data)["leave"]
    assert got.startswith("ok:"), got
    pids = [int(p) for p in got[3:].split(",")]
    assert all(pid_alive(p) for p in pids)
    return pids


def doctor(host: Any) -> str:
    rep = doctor_confine.report(host, "hostile")
    assert rep is not None
    return "\n".join(doctor_confine.render(rep))


async def restart(host: Any) -> None:
    [pid] = ready_pids(host, "hostile")
    os.kill(pid, signal.SIGKILL)
    await wait_replaced(host, "hostile", pid)


async def gone(pids: list[int], timeout: float = 10) -> bool:
    """Processes give no event to wait on: poll until every pid is dead (zombies count)."""
    with trio.move_on_after(timeout):
        while any(pid_alive(p) for p in pids):
            await trio.sleep(0.02)
        return True
    return False


def kill(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


@pytest.fixture(autouse=True)
def _pids_cgroup() -> None:
    need(KERNEL.pids_cgroup, "a writable pids cgroup (root, or a delegated one)")


async def test_without_keep_what_a_worker_left_dies_with_it(app: Path) -> None:
    async with running_host(app, sidecars(), host=HOST) as host:
        await wait_available(host, TOOL)
        sleepers = await leave(host, 2)
        try:
            assert "leftover processes: killed with the worker's group" in doctor(host)
            worker_group = pids_group(sleepers[0])
            assert "/toolhost-" in worker_group and KEPT_PREFIX not in worker_group
            await restart(host)
            assert await gone(sleepers), "a process outlived its worker without keep"
        finally:
            kill(sleepers)


async def test_without_confinement_the_same_processes_outlive_the_worker(app: Path) -> None:
    async with running_host(app, sidecars(), host={"confinement": "off"}) as host:
        await wait_available(host, TOOL)
        sleepers = await leave(host)
        try:
            await restart(host)
            assert all(pid_alive(p) for p in sleepers)
        finally:
            kill(sleepers)


@pytest.mark.parametrize("reload", ["removed", "keep-withdrawn"])
async def test_keep_sidecar_moves_them_to_the_kept_group_until_the_sidecar_goes(
    app: Path, reload: str
) -> None:
    async with running_host(app, sidecars(keep="sidecar"), host=HOST) as host:
        await wait_available(host, TOOL)
        sleepers = await leave(host, 2)
        try:
            shown = doctor(host)
            assert ", keep sidecar" in shown
            assert "leftover processes: kept until the sidecar is removed" in shown
            await restart(host)
            assert all(pid_alive(p) for p in sleepers), "kept processes died with the worker"
            kept = pids_group(sleepers[0])
            assert kept.endswith(f"/{KEPT_PREFIX}hostile"), kept
            # Still one of this host's confined processes for the kernel socket's peer check.
            assert host.confiner.refusal(sleepers[0])
            # A second worker's leftovers join the same group.
            more = await leave(host)
            sleepers += more
            await restart(host)
            assert pid_alive(more[0]) and pids_group(more[0]) == kept
            # The sidecar leaves the registry, or its profile no longer grants keep: its kept
            # processes die, the group goes.
            folder = folder_of(kept)
            write_registry(app, {} if reload == "removed" else sidecars(keep="worker"), host=HOST)
            await host.reload()
            assert await gone(sleepers), "kept processes outlived their sidecar"
            assert folder and not os.path.isdir(folder)
        finally:
            kill(sleepers)


async def test_kept_processes_never_pass_the_profiles_limit(app: Path) -> None:
    async with running_host(app, sidecars(keep="sidecar", processes=32), host=HOST) as host:
        await wait_available(host, TOOL)
        first = await leave(host, 20)
        second: list[int] = []
        try:
            await restart(host)
            assert all(pid_alive(p) for p in first)
            second = await leave(host, 20)
            await restart(host)  # 20 kept + 20 more would pass 32: the newcomers die
            assert await gone(second)
            assert all(pid_alive(p) for p in first)
        finally:
            kill(first + second)


@pytest.mark.parametrize("keep", ["sidecar", "host"])
async def test_the_kept_group_at_host_stop(app: Path, keep: str) -> None:
    sleepers: list[int] = []
    try:
        async with running_host(app, sidecars(keep=keep), host=HOST) as host:
            await wait_available(host, TOOL)
            sleepers = await leave(host)
            # Not restarted: the host's stop ends the worker, then the kept group's fate.
        if keep == "sidecar":
            assert await gone(sleepers), "kept processes outlived the host without keep: host"
            return
        assert all(pid_alive(p) for p in sleepers), "keep: host processes died with the host"
        kept = pids_group(sleepers[0])
        assert kept.endswith(f"/{KEPT_PREFIX}hostile"), kept
    finally:
        kill(sleepers)
    # The test cleans what an operator's later host or reboot would: the group and its folder.
    folder = folder_of(kept)
    assert folder, kept
    assert PidsCgroups.remove(folder)
    with contextlib.suppress(OSError):
        os.rmdir(os.path.dirname(folder))


def test_a_new_host_sweeps_the_empty_groups_of_hosts_that_are_gone() -> None:
    cgroups = PidsCgroups.probe()
    assert cgroups is not None
    parent = os.path.dirname(cgroups.base)
    dead = subprocess.Popen(["true"])
    dead.wait()
    gone_host = os.path.join(parent, f"toolhost-{dead.pid}")
    live_host = os.path.join(parent, f"toolhost-{os.getppid()}")  # alive: never touched
    gone_test = os.path.join(parent, f"toolhost-test-{dead.pid}")  # a test run's, stopped
    live_test = os.path.join(parent, f"toolhost-test-{os.getppid()}")
    made = [p for p in (gone_host, live_host, gone_test, live_test) if not os.path.exists(p)]
    for folder in made:
        os.makedirs(os.path.join(folder, f"{KEPT_PREFIX}x"))
    try:
        cgroups.sweep()
        assert not os.path.exists(gone_host) and not os.path.exists(gone_test)
        for live in (live_host, live_test):
            if live in made:
                assert os.path.isdir(os.path.join(live, f"{KEPT_PREFIX}x"))
    finally:
        for folder in made:
            for path in (os.path.join(folder, f"{KEPT_PREFIX}x"), folder):
                with contextlib.suppress(OSError):
                    os.rmdir(path)
