"""Crash safety: a real ``toolhost pkg`` process is stopped at each named step of stage, apply and
rollback and SIGKILLed there; the next host start (or the next ``pkg`` command) recovers, and the
package folders, the registry, ``.next`` and the snapshot all agree."""

import json
import os
import shutil
import signal
import subprocess
import sys

import json5
import pytest
import trio

from supervisor.calls.call import InvokeRequest
from supervisor.packages.manager import APPLY_STEPS, ROLLBACK_STEPS, STAGE_STEPS, PackageManager
from tests.conftest import running_host, wait_available, wait_for
from tests.pkgkit import TOOL, assert_no_absolute_paths, build, installed_version, registry_entry

pytestmark = pytest.mark.slow

COMMIT = "registry-swapped"
CASES = (
    [("apply", s) for s in APPLY_STEPS]
    + [("rollback", s) for s in ROLLBACK_STEPS]
    + [("stage", s) for s in STAGE_STEPS]
)


@pytest.fixture(scope="module")
def template(tmp_path_factory):
    """An app root with greet 2.0.0 installed (1.0.0 previous), both verified, and sources."""
    base = tmp_path_factory.mktemp("crash")
    app = base / "app"
    (app / "tools").mkdir(parents=True)
    src = base / "src"
    src.mkdir()
    mgr = PackageManager(app)
    mgr.lock.acquire()
    for version in ("1.0.0", "2.0.0"):
        mgr.stage(build(src, version))
        mgr.execute(mgr.prepare_apply("greet"))
        mgr.settle_verification("greet", "ready", "")
    mgr.lock.release()
    build(src, "3.0.0")
    return base


def expected(op, step):
    """(installed, previous, staged, upgrade) once recovery and verification are done."""
    if op == "stage":
        return ("2.0.0", "1.0.0", "3.0.0" if step == "renamed" else None)
    committed = list(APPLY_STEPS if op == "apply" else ROLLBACK_STEPS).index(step) >= list(
        APPLY_STEPS if op == "apply" else ROLLBACK_STEPS
    ).index(COMMIT)
    if op == "apply":
        return ("3.0.0", "2.0.0", None) if committed else ("2.0.0", "1.0.0", "3.0.0")
    return ("1.0.0", "2.0.0", None) if committed else ("2.0.0", "1.0.0", None)


def command(op, src):
    if op == "apply":
        return ["pkg", "apply", "greet"]
    if op == "rollback":
        return ["pkg", "rollback", "greet", "--yes"]
    return ["pkg", "stage", str(src / "greet-3.0.0-ok")]


async def kill_at(app, args, point):
    """Run ``toolhost <args>``, wait until it stops at ``point``, SIGKILL it there."""
    env = {
        **os.environ,
        "XDG_CONFIG_HOME": str(app / ".xdg"),
        "TOOLHOST_TEST_HOOKS": "1",
        "TOOLHOST_PKG_CRASH_AT": point,
    }
    proc = await trio.lowlevel.open_process(
        [sys.executable, "-m", "supervisor", *args, "--app-root", str(app)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=env,
    )
    try:
        err = b""
        with trio.fail_after(30):
            while f"crash point {point}".encode() not in err:
                chunk = await proc.stderr.receive_some(4096)
                assert chunk, f"exited before {point}: {err.decode()}"
                err += chunk
        proc.send_signal(signal.SIGKILL)
        with trio.fail_after(15):
            await proc.wait()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        await proc.stderr.aclose()
    assert proc.returncode == -signal.SIGKILL


def assert_consistent(app, installed, previous, staged):
    """Folders, registry, .next, journal and leftovers agree with each other and the outcome."""
    packages = app / "tools" / "packages"
    assert not (packages / ".journal.json").exists()
    assert installed_version(app) == installed
    assert installed_version(app, where=".previous") == previous
    assert registry_entry(app)["packageVersion"] == installed
    staged_dirs = sorted(p.name for p in (packages / ".staging").iterdir())
    assert staged_dirs == ([f"greet@{staged}"] if staged else [])
    nxt = app / "tools" / "external.tools.jsonc.next"
    if staged:
        assert json5.loads(nxt.read_text())["sidecars"]["greet"]["packageVersion"] == staged
    else:
        assert not nxt.exists()
    assert not (packages / ".trash").exists() or not any((packages / ".trash").iterdir())
    leftovers = [p for p in app.rglob("*") if ".tmp-" in p.name or ".incoming-" in p.name]
    assert leftovers == []
    assert_no_absolute_paths(app)


@pytest.mark.parametrize(("op", "step"), CASES, ids=[f"{o}:{s}" for o, s in CASES])
async def test_killed_at_a_step_then_the_host_recovers(template, tmp_path, op, step):
    app = tmp_path / "app"
    shutil.copytree(template / "app", app, symlinks=True)
    if op == "apply":
        mgr = PackageManager(app)
        with mgr.lock:
            mgr.stage(build(tmp_path, "3.0.0"))
    await kill_at(app, command(op, template / "src"), f"{op}:{step}")
    installed, previous, staged = expected(op, step)
    async with running_host(app) as host:
        assert host.upgrades.recovered or op == "stage"  # the host found and settled the crash
        want = "staged" if staged else "idle"
        await wait_for(
            host,
            lambda: host.catalog.get(TOOL) and host.catalog.get(TOOL).stability.upgrade == want,
        )
        await wait_available(host, TOOL)
        env = await host.invoker.invoke(InvokeRequest(TOOL))
        assert env.status == "success"
        assert json.loads(bytes(env.data))["version"] == installed
        assert_consistent(app, installed, previous, staged)
        status = await host.upgrades.status()
        assert [
            (p.installed, p.previous, p.staged, p.upgrade, p.problems) for p in status.packages
        ] == [(installed, previous, staged, want, [])]


async def test_a_pkg_command_recovers_too(template, tmp_path):
    app = tmp_path / "app"
    shutil.copytree(template / "app", app, symlinks=True)
    mgr = PackageManager(app)
    with mgr.lock:
        mgr.stage(build(tmp_path, "3.0.0"))
    await kill_at(app, command("apply", template / "src"), "apply:staged-moved")
    assert (app / "tools" / "packages" / ".journal.json").exists()
    out = subprocess.run(
        [sys.executable, "-m", "supervisor", "pkg", "status", "--json", "--app-root", str(app)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "XDG_CONFIG_HOME": str(app / ".xdg")},
    )
    assert out.returncode == 0, out.stderr
    status = json.loads(out.stdout)
    assert "undid the interrupted apply of greet (2.0.0 -> 3.0.0)" in status["recovered"][0]
    assert "recovered:" in out.stderr
    (pkg,) = status["packages"]
    assert (pkg["installed"], pkg["staged"], pkg["upgrade"]) == ("2.0.0", "3.0.0", "staged")
    assert_consistent(app, "2.0.0", "1.0.0", "3.0.0")
