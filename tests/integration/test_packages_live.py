"""Package operations against a running host, over the kernel protocol, with real sidecars.

A client keeps calling the package's tool while it is staged, applied and rolled back; every
call is answered by the version expected, and only the upgraded sidecar restarts.
"""

import shutil
from contextlib import asynccontextmanager

import pytest
import trio

from supervisor.calls.call import InvokeRequest
from supervisor.client import RpcError, open_client
from supervisor.host.host import build_host
from supervisor.host.loading import HostOptions
from supervisor.packages.manager import PackageManager
from tests.conftest import (
    FIXTURES,
    echo,
    running_host,
    unix_client,
    wait_available,
    wait_for,
    write_registry,
)
from tests.pkgkit import TOOL, assert_no_absolute_paths, build, installed_version

pytestmark = pytest.mark.slow


def offline(app, *steps):
    """Run manager steps with no host (like `toolhost pkg` without one): ("stage", path),
    ("apply", auto_rollback) or ("rollback",)."""
    mgr = PackageManager(app)
    mgr.lock.acquire()
    try:
        for step in steps:
            if step[0] == "stage":
                mgr.stage(step[1])
            elif step[0] == "apply":
                mgr.execute(mgr.prepare_apply("greet", auto_rollback=step[1]))
            else:
                mgr.execute(mgr.prepare_rollback("greet"))
    finally:
        mgr.lock.release()


def upgrade(host, tool=TOOL):
    d = host.catalog.get(tool)
    return d.stability.upgrade if d else None


@asynccontextmanager
async def served(app):
    """A host on ``app`` with the kernel socket, and one client connected to it."""
    async with running_host(app) as host, unix_client(host) as client:
        yield host, client


class Caller:
    """Keeps invoking the tool over the socket; records (start, end, status, version, code)."""

    def __init__(self, client):
        self.client = client
        self.calls = []
        self.pulse = trio.Event()
        self.stop = trio.Event()

    async def run(self):
        while not self.stop.is_set():
            t0 = trio.current_time()
            env = await self.client.invoke(TOOL, {})
            version = env.data["version"] if env.status == "success" else None
            code = env.error.code if env.error else None
            self.calls.append((t0, trio.current_time(), env.status, version, code, env.content))
            self.pulse.set()
            self.pulse = trio.Event()
            await trio.sleep(0.003)

    async def more(self, n=5, since=None):
        """Wait until ``n`` calls started after ``since`` have finished."""
        since = trio.current_time() if since is None else since
        with trio.fail_after(20):
            while sum(1 for c in self.calls if c[0] > since) < n:
                await self.pulse.wait()

    def versions(self, after, before=float("inf")):
        return {c[3] for c in self.calls if c[0] > after and c[1] < before and c[2] == "success"}


async def test_stage_apply_rollback_while_a_client_keeps_calling(app, tmp_path):
    (app / "bin").mkdir()
    shutil.copy(FIXTURES / "echo.py", app / "bin" / "echo.py")
    write_registry(
        app, {"good": {"command": "python", "args": ["bin/echo.py"], "tools": ["echo.say"]}}
    )
    offline(app, ("stage", build(tmp_path, "1.0.0")), ("apply", False))
    v2 = build(tmp_path, "1.1.0", archive=True)
    async with served(app) as (host, client):
        await wait_available(host, TOOL, "echo.say")
        await wait_for(host, lambda: upgrade(host) == "idle")  # verified at start
        good_pid = host.pools["good"].workers[0].pid
        seen = []

        async def watch(changes):
            async for event in changes:
                seen.extend((d.stability.upgrade, d.visible) for d in event.tools if d.name == TOOL)

        caller = Caller(client)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch, host.feed.subscribe())
            nursery.start_soon(caller.run)
            await caller.more()

            staged = await client.request("packages.stage", {"source": str(v2)})
            assert staged["upgrade"] == "staged" and staged["installed"] == "1.0.0"
            assert upgrade(host) == "staged" and host.catalog.get(TOOL).visible
            await caller.more()

            t_apply = trio.current_time()
            applied = await client.request("packages.apply", {"id": "greet"})
            t_applied = trio.current_time()
            assert applied["upgrade"] == "idle" and applied["verified"] is True
            assert (applied["fromVersion"], applied["toVersion"]) == ("1.0.0", "1.1.0")
            await caller.more()

            with pytest.raises(RpcError) as info:
                await client.request("packages.rollback", {"id": "greet"})
            assert info.value.code == "invalid-params" and "confirm" in info.value.message
            assert installed_version(app) == "1.1.0"  # nothing happened without confirm

            t_back = trio.current_time()
            back = await client.request("packages.rollback", {"id": "greet", "confirm": True})
            t_backed = trio.current_time()
            assert back["upgrade"] == "idle" and back["toVersion"] == "1.0.0"
            await caller.more()
            caller.stop.set()
            await trio.sleep(0)
            nursery.cancel_scope.cancel()

        calls = caller.calls
        assert {c[2] for c in calls} <= {"success", "unavailable"}, calls
        for c in calls:
            if c[2] == "unavailable":  # only while applying: hidden, never sent to a worker
                assert c[4] == "not-visible", c
                assert "applying greet" in c[5] or "rolling back greet" in c[5], c
        assert caller.versions(0, t_apply) == {"1.0.0"}
        assert caller.versions(t_applied, t_back) == {"1.1.0"}
        assert caller.versions(t_backed) == {"1.0.0"}
        assert ("applying", False) in seen and ("staged", True) in seen
        assert not any(visible for state, visible in seen if state == "applying")
        assert host.pools["good"].workers[0].pid == good_pid  # only greet was restarted
        status = await client.request("packages.status")
        (info,) = status["packages"]
        assert (info["installed"], info["previous"], info["upgrade"]) == ("1.0.0", "1.1.0", "idle")
    assert_no_absolute_paths(app)


@pytest.mark.parametrize(
    ("mode", "why"),
    [
        ("exit", "exited before ready"),
        ("probe-unavailable", "probe:"),
        ("missing-tool", "does not list greet.version"),
    ],
)
async def test_a_failing_new_version_requires_an_operator_decision(app, tmp_path, mode, why):
    offline(app, ("stage", build(tmp_path, "1.0.0")), ("apply", False))
    async with served(app) as (host, client):
        await wait_available(host, TOOL)
        await client.request("packages.stage", {"source": str(build(tmp_path, "1.1.0", mode=mode))})
        result = await client.request("packages.apply", {"id": "greet"})
        assert result["upgrade"] == "rollback-required" and result["verified"] is False
        assert why in result["message"], result["message"]
        d = host.catalog.get(TOOL)
        assert not d.visible and d.stability.upgrade == "rollback-required"
        reason = d.stability.reasons[0]
        assert reason.code == "rollback-required" and why in reason.message
        assert "toolhost pkg rollback greet --yes" in reason.hint
        env = await client.invoke(TOOL, {})
        assert env.status == "unavailable" and env.error.code == "not-visible"
        assert installed_version(app) == "1.1.0"  # no rollback without the operator
        status = await client.request("packages.status")
        assert status["packages"][0]["upgrade"] == "rollback-required"
        assert status["packages"][0]["previous"] == "1.0.0"

        back = await client.request("packages.rollback", {"id": "greet", "confirm": True})
        assert back["upgrade"] == "idle" and back["verified"] is True
        await wait_available(host, TOOL)
        env = await client.invoke(TOOL, {})
        assert env.status == "success" and env.data["version"] == "1.0.0"


async def test_auto_rollback_restores_the_previous_version(app, tmp_path):
    offline(app, ("stage", build(tmp_path, "1.0.0")), ("apply", False))
    async with served(app) as (host, client):
        await wait_available(host, TOOL)
        bad = build(tmp_path, "1.1.0", mode="probe-unavailable")
        await client.request("packages.stage", {"source": str(bad)})
        result = await client.request("packages.apply", {"id": "greet", "autoRollback": True})
        assert result["rolledBack"] is True and result["upgrade"] == "idle"
        assert result["toVersion"] == "1.1.0" and "rolled back to 1.0.0" in result["message"]
        env = await client.invoke(TOOL, {})
        assert env.status == "success" and env.data["version"] == "1.0.0"
        assert installed_version(app, where=".previous") == "1.1.0"


async def test_a_failing_first_install_is_failed(app, tmp_path):
    write_registry(app, {})
    async with served(app) as (host, client):
        await client.request(
            "packages.stage", {"source": str(build(tmp_path, "1.0.0", mode="exit"))}
        )
        result = await client.request("packages.apply", {"id": "greet", "autoRollback": True})
        assert result["upgrade"] == "failed" and result["rolledBack"] is False
        assert "no previous version" in result["message"]
        assert host.catalog.get(TOOL).stability.upgrade == "failed"


async def test_bad_package_over_the_socket_is_refused_with_its_problems(app, tmp_path):
    offline(app, ("stage", build(tmp_path, "1.0.0")), ("apply", False))
    bad = build(tmp_path, "2.0.0", toml={"command": "/bin/sh", "tools": ["git.push"]})
    async with served(app) as (host, client):
        await wait_available(host, TOOL)
        with pytest.raises(RpcError) as info:
            await client.request("packages.stage", {"source": str(bad)})
        assert info.value.code == "invalid-params"
        assert info.value.data["reason"] == "invalid-package"
        problems = "\n".join(info.value.data["problems"])
        assert "absolute paths are refused" in problems and "git.push is a builtin" in problems
        unversioned = build(tmp_path / "u", "2.0.0", toml={"version": None, "checksum": None})
        with pytest.raises(RpcError) as info:
            await client.request("packages.stage", {"source": str(unversioned)})
        assert info.value.data["problems"] == [
            "package.toml: version: required field missing",
            "package.toml: checksum: required field missing",
        ]
        with pytest.raises(RpcError) as info:
            await client.request("packages.apply", {"id": "greet"})
        assert info.value.code == "not-found"
        assert upgrade(host) == "idle" and host.catalog.get(TOOL).visible


async def test_an_apply_survives_its_client_leaving(app, tmp_path):
    offline(app, ("stage", build(tmp_path, "1.0.0")), ("apply", False))
    async with served(app) as (host, client):
        await wait_available(host, TOOL)
        await client.request("packages.stage", {"source": str(build(tmp_path, "1.1.0"))})
        sock = host.upgrades  # the operation runs in the host, not in the connection
        async with open_client(client_path(client)) as other:
            with trio.move_on_after(0.05):
                await other.request("packages.apply", {"id": "greet"})
        await wait_for(host, lambda: installed_version(app) == "1.1.0" and upgrade(host) == "idle")
        await wait_available(host, TOOL)
        env = await client.invoke(TOOL, {})
        assert env.data["version"] == "1.1.0" and sock.manager.record("greet") is None


def client_path(client):
    return client.stream.socket.getpeername()


async def test_a_version_applied_offline_is_verified_at_start(app, tmp_path):
    offline(
        app,
        ("stage", build(tmp_path, "1.0.0")),
        ("apply", False),
        ("stage", build(tmp_path, "1.1.0")),
        ("apply", False),
    )
    host = await build_host(
        HostOptions(app_root=str(app), use_global=False, manifest_dirs=[], seed=1)
    )
    changes = host.feed.subscribe()
    seen = []
    async with trio.open_nursery() as nursery:
        await nursery.start(host.run)
        with trio.fail_after(20):
            async for event in changes:
                seen += [(d.stability.upgrade, d.visible) for d in event.tools if d.name == TOOL]
                if seen and seen[-1] == ("idle", True):
                    break
        env = await host.invoker.invoke(InvokeRequest(TOOL))
        host.stop()
        await host.wait_stopped()
        nursery.cancel_scope.cancel()
    assert seen[0] == ("applying", False) and seen[-1] == ("idle", True)
    assert not any(v for u, v in seen if u == "applying")
    assert env.status == "success"
    assert PackageManager(app).record("greet") is None


async def test_an_offline_auto_rollback_is_honoured_at_start(app, tmp_path):
    offline(
        app,
        ("stage", build(tmp_path, "1.0.0")),
        ("apply", False),
        ("stage", build(tmp_path, "1.1.0", mode="exit")),
        ("apply", True),
    )
    async with running_host(app) as host:
        await wait_for(host, lambda: installed_version(app) == "1.0.0" and upgrade(host) == "idle")
        await wait_available(host, TOOL)
        env = await host.invoker.invoke(InvokeRequest(TOOL))
        assert env.data is not None and b'"1.0.0"' in bytes(env.data)


async def test_the_managers_state_beats_a_hand_edited_upgrade_field(app, tmp_path):
    offline(app, ("stage", build(tmp_path, "1.0.0")), ("apply", False))
    reg = app / "tools" / "external.tools.jsonc"
    text = reg.read_text().replace(
        '"packageId": "greet",', '"packageId": "greet", "upgrade": "failed",'
    )
    reg.write_text(text)
    write_registry(
        app,
        {
            "greet": __import__("json5").loads(text)["sidecars"]["greet"],
            "other": echo(tools=["echo.say"], upgrade="rollback-required"),
            "old": echo(tools=["echo.env"], compatibleCore=">=99"),
            "proto": echo(tools=["echo.fail"], protocolVersion="2"),
        },
    )
    async with running_host(app) as host:
        await wait_available(host, TOOL)
        assert upgrade(host) == "idle"  # managed: the package manager decides
        other = host.catalog.get("echo.say").stability
        assert other.upgrade == "rollback-required" and other.effective == "unavailable"
        for tool, fragment in (("echo.env", "compatibleCore '>=99'"), ("echo.fail", "protocol 2")):
            d = host.catalog.get(tool)
            assert d.stability.version == "incompatible" and not d.visible
            assert d.stability.reasons[0].code == "version-incompatible"
            assert fragment in d.stability.reasons[0].message
