"""The Unix socket gate (``processes/unix_gate.py``, ``host/unix_gate.py``), through the real
host: a sidecar granted ``unix`` paths reaches those sockets and no other (the kernel socket,
another socket on the machine, an abstract one, the kernel socket under another name in a
granted folder), from any thread and by a relative path too; with ``host.confinement: off`` it
reaches them all (so the test tests something)."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import msgspec
import pytest

from supervisor.calls.call import InvokeRequest
from supervisor.contracts.confine import ConfinePlan
from supervisor.processes import confine, unix_gate
from tests.conftest import raw, running_host, wait_available, wait_for
from tests.integration.confine_kit import need
from tests.integration.test_confine_host import (
    KERNEL,
    SPAWNS,
    assert_started_by,
    entry,
    host_config,
    nothing_came,
    world,
)
from tests.kernel import served


def unix_listener(path: str) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(path)
    s.listen(8)
    s.setblocking(False)
    return s


def accepted(s: socket.socket) -> int:
    n = 0
    while not nothing_came(s):
        n += 1
    return n


def gated_world(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[dict[str, Path], Path, socket.socket]:
    """The hostile world, a granted folder ``x11`` and a listening socket ``X0`` in it."""
    need(bool(KERNEL.seccomp and KERNEL.arch), "seccomp filters on x86_64/aarch64")
    need(not unix_gate.available(), f"the Unix socket gate: {unix_gate.available()}")
    w = world(tmp_path, monkeypatch)
    granted = tmp_path / "x11"
    granted.mkdir()
    return w, granted, unix_listener(str(granted / "X0"))


@pytest.mark.parametrize("spawn", SPAWNS)
@pytest.mark.parametrize("confinement", ["best-effort", "off"])
async def test_a_unix_grant_reaches_its_sockets_and_no_other(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, confinement: str, spawn: str
) -> None:
    w, granted, x0 = gated_world(tmp_path, monkeypatch)
    other = unix_listener(str(tmp_path / "docker.sock"))
    abstract = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    name = f"\0toolhost-gate-test-{tmp_path.name}"
    abstract.bind(name)
    abstract.listen(4)
    abstract.setblocking(False)
    e = entry("persistent")
    e["confine"] = {"unix": [str(granted)]}
    async with (
        running_host(w["app"], {"hostile": e}, host=host_config(confinement, spawn)) as host,
        served(host, w["app"]) as srv,
    ):
        await wait_available(host, "hostile.attack", timeout=40)
        assert_started_by(host, spawn, "persistent", confinement)
        # The kernel socket under a granted name (a hard link an operator's tool could leave):
        # the name passes the path check, the inode must not.
        os.link(srv.sock, granted / "alias")
        todo = {
            "granted": {"kind": "unix", "path": str(granted / "X0")},
            "thread": {"kind": "unix_thread", "path": str(granted / "X0")},
            "relative": {"kind": "unix_relative", "cwd": str(granted), "path": "X0"},
            "other": {"kind": "unix", "path": str(tmp_path / "docker.sock")},
            "kernel": {"kind": "unix", "path": str(srv.sock)},
            "alias": {"kind": "unix", "path": str(granted / "alias")},
            "escape": {"kind": "unix_relative", "cwd": str(granted), "path": "../docker.sock"},
            "abstract": {"kind": "unix", "path": name},
            "dgram": {"kind": "unix_dgram_socket"},
        }
        env = await host.invoker.invoke(InvokeRequest("hostile.attack", raw({"attacks": todo})))
        assert env.status == "success", env
        data = msgspec.json.decode(env.data)
        gate = host.confiner.gate
    if confinement == "off":
        assert data == {name: "ok" for name in todo}
        assert accepted(x0) == 3 and accepted(other) == 2 and accepted(abstract) == 1
        return
    assert data == {
        "granted": "ok",
        "thread": "ok",
        "relative": "ok",
        "other": "EACCES",
        "kernel": "EACCES",
        "alias": "EACCES",
        "escape": "EACCES",
        "abstract": "ECONNREFUSED",
        "dgram": "EPERM",
    }
    assert accepted(x0) == 3  # the three allowed connects, made by the gate on its socket
    assert accepted(other) == 0 and accepted(abstract) == 0
    assert gate is not None and gate.refused == 4 and gate.answered == 8  # abstract: quiet


async def test_each_workers_gate_ends_with_its_processes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A oneshot worker per call: each call's gate task ends when that worker's processes are
    gone (the notification descriptor hangs up), so none piles up; a start that never reports
    is not waited for."""
    w, granted, x0 = gated_world(tmp_path, monkeypatch)
    e = entry("oneshot")
    e["confine"] = {"unix": [str(granted)]}
    todo = {"granted": {"kind": "unix", "path": str(granted / "X0")}}
    async with running_host(
        w["app"], {"hostile": e}, host=host_config("best-effort", "shim")
    ) as host:
        await wait_available(host, "hostile.attack", timeout=40)
        gate = host.confiner.gate
        assert gate is not None
        for _ in range(4):
            env = await host.invoker.invoke(InvokeRequest("hostile.attack", raw({"attacks": todo})))
            assert msgspec.json.decode(env.data) == {"granted": "ok"}
        await wait_for(host, lambda: gate.serving == 0, what="every oneshot worker's gate ended")
    assert accepted(x0) == 4 and gate.answered >= 4


def test_the_facts_say_when_unix_grants_are_not_gated() -> None:
    """Where the gate cannot run (an older kernel), ``missing`` says that a ``unix`` grant
    reaches every pathname socket; where it ran, nothing is missing for it."""
    plan = ConfinePlan(sidecar="x", mode="best-effort", unix=("/tmp/.X11-unix",), allow_unix=True)
    ungated = confine.facts(plan, os.getpid(), {"gate": False, "errors": []})
    gated = confine.facts(plan, os.getpid(), {"gate": True, "errors": []})
    assert any(m.startswith("confine.unix by path") for m in ungated.missing)
    assert not any(m.startswith("confine.unix") for m in gated.missing)
    bare = ConfinePlan(sidecar="y", mode="best-effort")
    no_grant = confine.facts(bare, os.getpid(), {"errors": []})
    assert not any(m.startswith("confine.unix") for m in no_grant.missing)
