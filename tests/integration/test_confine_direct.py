"""The exec shim's ``--python`` form (no zygote): a confined Python worker of the host's own
interpreter starts that interpreter on the shim, which puts the walls up and runs the worker's
module or script in it (one interpreter start, not two). The worker sees what the same worker
exec'd by the shim sees (argv, ``sys.orig_argv``, ``sys.path``, ``__main__``, flags,
descriptors, no shim module left, the same traceback when it fails) and stands behind the same
walls; a start whose interpreter would read what a worker can write keeps the shim's exec."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from supervisor.contracts.confine import Profile
from supervisor.processes import confine_direct
from supervisor.processes.child import Child
from supervisor.processes.confine import SidecarWalls, read_status
from supervisor.processes.confine_spawn import SidecarConfinement
from supervisor.processes.spawn import Spawner, allowed_env, exec_child
from supervisor.processes.warden import process_warden
from tests.integration.confine_kit import KERNEL, World, make_world, need

VIEW = """\
import json, os, sys

def fds():
    out = []
    for name in os.listdir("/proc/self/fd"):
        try:
            os.fstat(int(name))
        except OSError:
            continue
        out.append(int(name))
    return sorted(out)

FDS = fds()
NAMES = sorted(globals())
if os.environ.get("VIEW_FAIL"):
    raise RuntimeError("the worker fails")
status = [x for x in open("/proc/self/status").read().splitlines()
          if x.startswith(("Seccomp:", "NoNewPrivs:"))]
print(json.dumps({
    "argv": sys.argv,
    "origArgv": sys.orig_argv,
    "path": sys.path,
    "names": NAMES,
    "file": globals().get("__file__"),
    "spec": getattr(globals().get("__spec__"), "name", None),
    "flags": list(sys.flags),
    "fds": FDS,
    "shim": sorted(m for m in ("walls", "landlock", "seccomp", "linux", "netns", "pymain")
                   if m in sys.modules),
    "status": sorted(" ".join(x.split()) for x in status),
}), flush=True)
sys.stdin.read()
"""

ENV = allowed_env(os.environ, {})


@pytest.fixture
def world(tmp_path: Path) -> World:
    need(KERNEL.landlock_abi >= 1, "Landlock")
    need(bool(KERNEL.seccomp and KERNEL.arch), "seccomp filters on x86_64/aarch64")
    w = make_world(tmp_path)
    pkg = w.app / "viewpkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "__main__.py").write_text(VIEW)
    (w.app / "view.py").write_text(VIEW)
    return w


def start(
    confine: SidecarConfinement, world: World, argv: list[str], env: dict[str, str], way: str
) -> Child:
    """``direct``: as the spawner starts it without a zygote; ``exec``: the same walls, the
    shim's exec form (what every start took before the ``--python`` form)."""
    if way == "direct":
        return Spawner(None).spawn(argv, cwd=str(world.app), env=env, confine=confine)
    prepared = confine.prepare(argv)  # no environment given: the shim execs
    assert prepared.why_exec and prepared.argv[-len(argv) - 1] == "--"
    child = exec_child(
        prepared.argv,
        cwd=str(world.app),
        env={**env, **prepared.env},
        warden=process_warden(),
        pass_fds=prepared.pass_fds,
    )
    prepared.via = "shim"
    prepared.started()
    child.confinement = prepared
    return child


@contextmanager
def confinement(world: World) -> Iterator[SidecarConfinement]:
    plan = world.plan(Profile())
    confine = SidecarConfinement(plan, SidecarWalls(plan))
    try:
        yield confine
    finally:
        confine.close()


async def output(child: Child, *, wait: bool) -> tuple[bytes, bytes, int | None]:
    """The first line (``wait``: then the walls' report is checked, stdin closed and the exit
    awaited) or, for a worker that fails, everything it wrote and its status."""
    assert child.stdout is not None and child.stderr is not None and child.stdin is not None
    out = err = b""
    with trio.fail_after(30):
        if wait:
            while b"\n" not in out and (chunk := await child.stdout.receive_some(65536)):
                out += chunk
            assert child.confinement is not None and child.confinement.report() is not None
            await child.stdin.aclose()
        else:
            while chunk := await child.stdout.receive_some(65536):
                out += chunk
            while chunk := await child.stderr.receive_some(65536):
                err += chunk
        rc = await child.wait()
    await child.aclose_streams()
    return out, err, rc


FORMS = {
    "module": ["-m", "viewpkg", "--flag", "x"],
    "script": ["view.py", "a"],
    "flags": ["-u", "-X", "dev", "-B", "-m", "viewpkg"],
    "isolated": ["-I", "view.py"],
}


@pytest.mark.parametrize("form", list(FORMS))
async def test_a_direct_worker_sees_what_a_shim_execd_worker_sees(world: World, form: str) -> None:
    argv = [sys.executable, *FORMS[form]]
    seen: dict[str, dict[str, Any]] = {}
    with confinement(world) as confine:
        for way in ("direct", "exec"):
            child = start(confine, world, argv, ENV, way)
            prepared = child.confinement
            assert prepared is not None and prepared.via == "shim"
            if way == "direct":
                assert prepared.why_exec == "", prepared.why_exec
                assert "--python" in prepared.argv and prepared.argv[0] == sys.executable
            out, _err, rc = await output(child, wait=True)
            assert rc == 0, (way, out)
            seen[way] = json.loads(out)
    direct, execd = seen["direct"], seen["exec"]
    for key in execd:
        assert direct[key] == execd[key], key
    assert direct["shim"] == [] and direct["fds"] == [0, 1, 2]
    assert direct["status"] == ["NoNewPrivs: 1", "Seccomp: 2"]
    assert direct["origArgv"] == argv


@pytest.mark.parametrize("form", ["module", "script"])
async def test_a_failing_direct_worker_prints_what_a_shim_execd_one_prints(
    world: World, form: str
) -> None:
    argv = [sys.executable, *FORMS[form]]
    seen: dict[str, tuple[bytes, int | None]] = {}
    with confinement(world) as confine:
        for way in ("direct", "exec"):
            child = start(confine, world, argv, {**ENV, "VIEW_FAIL": "1"}, way)
            assert child.confinement is not None
            assert (child.confinement.why_exec == "") == (way == "direct")
            _out, err, rc = await output(child, wait=False)
            seen[way] = (err, rc)
    assert seen["direct"] == seen["exec"]
    err, rc = seen["direct"]
    assert rc == 1 and err.decode().endswith("RuntimeError: the worker fails\n"), err
    assert b"confine_exec" not in err and b"pymain" not in err


async def test_a_direct_worker_is_walled(world: World) -> None:
    with confinement(world) as confine:
        argv = [sys.executable, "-m", "viewpkg"]
        child = Spawner(None).spawn(argv, cwd=str(world.app), env=ENV, confine=confine)
        assert child.confinement is not None and child.confinement.why_exec == ""
        assert child.stdout is not None
        with trio.fail_after(30):
            await child.stdout.receive_some(65536)
        status = read_status(child.pid)
        facts = child.confinement.facts(child.pid)
        assert child.stdin is not None
        await child.stdin.aclose()
        with trio.fail_after(30):
            assert await child.wait() == 0
        await child.aclose_streams()
    assert (status["Seccomp"], status["NoNewPrivs"]) == ("2", "1")
    assert facts.filesystem == "enforced" and facts.syscalls == "filtered"


def test_what_keeps_the_shims_exec(world: World) -> None:
    site_packages = next(p for p in sys.path if p.endswith("site-packages"))
    app = str(world.app)
    ok = [sys.executable, "-m", "viewpkg"]
    assert confine_direct.problem(ok, app, ENV, [str(world.tmpdir)]) is None
    cases = {
        "a write grant on a site folder": (ok, ENV, [site_packages]),
        "a write grant above one": (ok, ENV, [os.path.dirname(site_packages)]),
        "a write grant below one": (ok, ENV, [os.path.join(site_packages, "x")]),
        "PYTHONPATH": (ok, {**ENV, "PYTHONPATH": app}, []),
        "another interpreter": (["/bin/sh", "-c", "true"], ENV, []),
        "-c": ([sys.executable, "-c", "pass"], ENV, []),
        "-x": ([sys.executable, "-x", "view.py"], ENV, []),
        "no such script": ([sys.executable, "gone.py"], ENV, []),
        "a folder": ([sys.executable, "viewpkg"], ENV, []),
    }
    for what, (argv, env, writable) in cases.items():
        assert confine_direct.problem(argv, app, env, writable) is not None, what
    # -E: the interpreter ignores PYTHON* variables
    assert (
        confine_direct.problem(
            [sys.executable, "-E", "-m", "viewpkg"], app, {**ENV, "PYTHONPATH": app}, []
        )
        is None
    )
