"""Confined starts through the zygote (PROTOCOL 7, issue 28): the host sends a worker's walls
with its fork request, the zygote's child puts them up before the worker's first instruction
and then runs the Python worker in the zygote's interpreter (``startedBy: zygote``) or execs
its program (``exec``). Read back from the running process: ``Seccomp: 2``, ``NoNewPrivs: 1``,
a planted file outside its grants unreadable, its children walled too, its private ``TMPDIR``
removed when it ends. Without walls, the same worker from the same zygote reads the file."""

from __future__ import annotations

import errno
import json
import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from supervisor.contracts.confine import Profile
from supervisor.processes import zygote
from supervisor.processes.child import Child
from supervisor.processes.confine import SidecarWalls, read_status
from supervisor.processes.confine_spawn import SidecarConfinement
from supervisor.processes.pids_cgroup import PidsCgroups
from supervisor.processes.spawn import Spawner, allowed_env
from tests.integration.confine_kit import KERNEL, World, make_world, need

pytestmark = pytest.mark.skipif(
    zygote.forced_exec() or zygote.platform_problem() is not None,
    reason=f"no zygote: {zygote.platform_problem() or 'TOOLHOST_SPAWN=exec'}",
)

WORKER = """\
import errno, json, os, subprocess, sys

def attempt(fn):
    try:
        fn()
        return "ok"
    except OSError as exc:
        return errno.errorcode.get(exc.errno, str(exc.errno))

def write_tmp():
    with open(os.path.join(os.environ.get("TMPDIR", "/tmp"), "scratch"), "w") as f:
        f.write("x")

key, planted = sys.argv[1], sys.argv[2]
cat = subprocess.run(["cat", key], capture_output=True, text=True)
child = subprocess.run(["cat", "/proc/self/status"], capture_output=True, text=True).stdout
lines = [x for x in child.splitlines() if x.startswith(("Seccomp:", "NoNewPrivs:"))]
print(json.dumps({
    "key": attempt(lambda: open(key).read()),
    "planted": attempt(lambda: open(planted).read()),
    "tmpdir": attempt(write_tmp),
    "cat": "ok" if cat.returncode == 0 else "denied" if "denied" in cat.stderr else cat.stderr,
    "childStatus": sorted(" ".join(x.split()) for x in lines),
}), flush=True)
sys.stdin.read()  # stay alive until the test has read /proc/<pid>
"""


ENV = allowed_env(os.environ, {})
"""The zygote's own environment (a different ``HOME`` would make a Python worker exec'd)."""


@pytest.fixture
def world(tmp_path: Path) -> World:
    need(KERNEL.landlock_abi >= 6, "Landlock ABI 6 (Linux 6.12)")
    need(bool(KERNEL.seccomp and KERNEL.arch), "seccomp filters on x86_64/aarch64")
    return make_world(tmp_path)


@asynccontextmanager
async def running_zygote(app: Path, reply_timeout_s: float = 2.0) -> AsyncIterator[zygote.Zygote]:
    """A zygote of its own for ``app`` (ready), stopped afterwards."""
    z = zygote.Zygote(app_root=str(app), reply_timeout_s=reply_timeout_s)
    async with trio.open_nursery() as nursery:
        await nursery.start(z.run)
        assert z.state == "ready", z.status()
        try:
            yield z
        finally:
            nursery.cancel_scope.cancel()


async def first_line(child: Child) -> dict[str, Any]:
    assert child.stdout is not None
    data = b""
    with trio.fail_after(30):
        while b"\n" not in data:
            chunk = await child.stdout.receive_some(65536)
            if not chunk:
                break
            data += chunk
    assert data, "the worker printed nothing"
    result: dict[str, Any] = json.loads(data.split(b"\n", 1)[0])
    return result


async def stop(child: Child) -> int:
    assert child.stdin is not None
    await child.stdin.aclose()
    with trio.fail_after(15):
        rc = await child.wait()
    await child.aclose_streams()
    return rc


@pytest.mark.parametrize("run", [True, False], ids=["forked", "exec"])
async def test_a_zygote_started_confined_worker_has_its_walls(world: World, run: bool) -> None:
    script = world.project / "worker.py"  # project: read (the strict default) grants it
    script.write_text(WORKER)
    planted = world.root / "planted.txt"
    planted.write_text("not yours")
    plan = world.plan(Profile())
    groups = PidsCgroups.probe(f"toolhost-test-{os.getpid()}") if plan.pids == "cgroup" else None
    confine = SidecarConfinement(plan, SidecarWalls(plan), groups)
    argv = [sys.executable, str(script), str(world.key), str(planted)]
    try:
        async with running_zygote(world.app) as z:
            child = Spawner(z).spawn(
                argv, cwd=str(world.app), env=ENV, may_fork=run, confine=confine
            )
            prepared = child.confinement
            assert prepared is not None and prepared.via == "zygote"
            assert child.started_by == ("zygote" if run else "exec")
            assert (z.forks, z.execs, z.fallbacks) == ((1, 0, 0) if run else (0, 1, 0))
            seen = await first_line(child)
            status = read_status(child.pid)
            facts = prepared.facts(child.pid)
            tmpdir = prepared.env["TMPDIR"]
            assert os.path.isdir(tmpdir)
            rc = await stop(child)
    finally:
        confine.close()
        if groups is not None:
            groups.close()
    assert (status["Seccomp"], status["NoNewPrivs"]) == ("2", "1")
    assert seen == {
        "key": "EACCES",
        "planted": "EACCES",
        "tmpdir": "ok",
        "cat": "denied",  # its children inherit the walls
        "childStatus": ["NoNewPrivs: 1", "Seccomp: 2"],
    }
    assert facts.filesystem == "enforced" and facts.syscalls == "filtered"
    assert facts.no_new_privs and facts.network == "isolated" and facts.missing == []
    assert rc == 0
    assert not os.path.exists(tmpdir)  # removed when the worker ended


async def test_the_same_worker_unconfined_reads_the_planted_file(world: World) -> None:
    script = world.project / "worker.py"
    script.write_text(WORKER)
    planted = world.root / "planted.txt"
    planted.write_text("not yours")
    argv = [sys.executable, str(script), str(world.key), str(planted)]
    async with running_zygote(world.app) as z:
        child = Spawner(z).spawn(argv, cwd=str(world.app), env=ENV, may_fork=True)
        assert child.started_by == "zygote" and child.confinement is None
        seen = await first_line(child)
        status = read_status(child.pid)
        assert await stop(child) == 0
    assert status["Seccomp"] == "0" and status["NoNewPrivs"] == "0"
    assert seen["key"] == seen["planted"] == seen["cat"] == "ok"


async def test_a_program_the_walls_refuse_ends_with_126(world: World) -> None:
    """A program that exists and is executable, in a folder the profile does not grant ($HOME): the
    parent's check passes, the walled child's ``execve`` is refused (Landlock), and the child
    ends 126 saying so. (A missing program is refused before any fork: ``start-failed``.)"""
    plan = world.plan(Profile())
    confine = SidecarConfinement(plan, SidecarWalls(plan))
    program = world.home / "tool.sh"
    program.write_text("#!/bin/sh\necho ran\n")
    program.chmod(0o755)
    missing = str(world.project / "no-such-program")
    try:
        async with running_zygote(world.app) as z:
            spawner = Spawner(z)
            with pytest.raises(FileNotFoundError):
                spawner.spawn([missing], cwd=str(world.app), env=ENV, confine=confine)
            child = spawner.spawn([str(program)], cwd=str(world.app), env=ENV, confine=confine)
            assert child.confinement is not None and child.confinement.via == "zygote"
            assert child.stderr is not None and child.stdout is not None
            err = out = b""
            with trio.fail_after(15):
                while chunk := await child.stderr.receive_some(4096):
                    err += chunk
                while chunk := await child.stdout.receive_some(4096):
                    out += chunk
                rc = await child.wait()
            await child.aclose_streams()
    finally:
        confine.close()
    assert rc == 126 and out == b""
    assert f"cannot execute {program}: {os.strerror(errno.EACCES)}" in err.decode()
