"""Shared test helpers: apps in temp folders, a running host, waiting on events (never sleeps)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from supervisor.calls.call import InvokeRequest
from supervisor.processes.pids_cgroup import PidsCgroups

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "tests" / "fixtures" / "sidecars"


def hold_host_lock(
    root: Path, role: str = "serve", *, seconds: float | None = None, legacy: bool = False
) -> subprocess.Popen[str]:
    """Another process holding ``root``'s host lock as a host of ``role`` does (``legacy``: as
    a host of a version that wrote only its pid), returned once it holds it. It lets go when its
    stdin closes (``.communicate("")``), or after ``seconds``."""
    if legacy:
        lock = str(root / ".toolhost" / "host.lock")
        take = (
            f"import fcntl, os; fd = os.open({lock!r}, os.O_RDWR | os.O_CREAT); "
            "fcntl.flock(fd, fcntl.LOCK_EX); os.write(fd, b'%d\\n' % os.getpid())"
        )
    else:
        take = (
            "from supervisor.cli.common import lock_root; "
            f"lock = lock_root({str(root)!r}, '', {role!r})"
        )
    wait = "sys.stdin.read()" if seconds is None else f"time.sleep({seconds})"
    holder = subprocess.Popen(
        [sys.executable, "-c", f"import sys, time; {take}; print('held', flush=True); {wait}"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=str(REPO),
    )
    assert holder.stdout is not None and holder.stdout.readline() == "held\n"
    return holder


@pytest.fixture(scope="session", autouse=True)
def _pids_groups_of_this_run() -> Iterator[None]:
    """The pids groups this test process made (``toolhost-test-<pid>``, which tests probe by,
    and ``toolhost-<pid>``, its in-process hosts'): a test that fails midway leaves its
    workers' groups there. Removed when the session ends, what is left in them killed; a
    session killed outright leaves them to the next host's sweep (``PidsCgroups.sweep``)."""
    yield
    for tag in (f"toolhost-test-{os.getpid()}", None):
        groups = PidsCgroups.probe(tag)
        if groups is None:
            return
        names = os.listdir(groups.base) if os.path.isdir(groups.base) else []
        for name in names:  # the worker groups and kept groups in it (its files are not folders)
            if os.path.isdir(os.path.join(groups.base, name)):
                PidsCgroups.remove(os.path.join(groups.base, name))
        groups.close()


def script(name: str, tools: list[str], **extra: Any) -> dict[str, Any]:
    """A registry entry running ``tests/fixtures/sidecars/<name>.py`` with the host's python."""
    entry: dict[str, Any] = {
        "command": "python",
        "args": [str(FIXTURES / f"{name}.py")],
        "tools": tools,
        "restart": {"backoffMs": 20, "maxBackoffMs": 200},
    }
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(entry.get(key), dict):
            entry[key] = {**entry[key], **value}
        else:
            entry[key] = value
    return entry


ECHO_TOOLS = ["echo.say", "echo.sleep", "echo.fail", "echo.crash", "echo.env"]


def echo(tools: list[str] | None = None, **extra: Any) -> dict[str, Any]:
    return script("echo", tools or ECHO_TOOLS, **extra)


def read_only_manifests(root: Path, tools: list[str]) -> list[str]:
    """A manifest folder (for ``running_host(manifest_dirs=...)``) marking ``tools`` readOnly:
    a client leaving cancels their calls instead of letting them run to their end."""
    folder = root / ".manifests"
    folder.mkdir(exist_ok=True)
    body = "".join(f'[[tool]]\nname = "{t}"\nreadOnly = true\n\n' for t in tools)
    (folder / "read-only.toml").write_text(body)
    return [str(folder)]


def write_registry(root: Path, sidecars: dict[str, Any], **top: Any) -> Path:
    path = root / "tools" / "external.tools.jsonc"
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {"schemaVersion": 2, **top, "sidecars": sidecars}
    path.write_text(json.dumps(doc, indent=2))
    return path


def free_port() -> int:
    """A loopback TCP port nobody listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.fixture
def app(tmp_path: Path) -> Path:
    root = tmp_path / "app"
    root.mkdir()
    return root


@pytest.fixture
def project(app: Path) -> Path:
    """The default ``projectDir`` of ``app`` (``workspace/``, PROTOCOL 1), made ahead of the host
    so a test can put files there before it starts."""
    folder = app / "workspace"
    folder.mkdir()
    return folder


@asynccontextmanager
async def running_host(
    root: Path,
    sidecars: dict[str, Any] | None = None,
    *,
    manifest_dirs: list[str] | None = None,
    **top: Any,
) -> AsyncIterator[Any]:
    """Write the registry (when given) and run a Host on it for the block."""
    from supervisor.host.host import build_host
    from supervisor.host.loading import HostOptions

    if sidecars is not None:
        write_registry(root, sidecars, **top)
    host = await build_host(
        HostOptions(
            app_root=str(root),
            use_global=False,
            manifest_dirs=manifest_dirs if manifest_dirs is not None else [],
            seed=1234,
            cancel_grace_ms=300,
            stop_grace_ms=1000,
        )
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(host.run)
        try:
            yield host
        finally:
            host.stop()
            with trio.move_on_after(15):
                await host.wait_stopped()
            nursery.cancel_scope.cancel()


@asynccontextmanager
async def unix_client(host: Any) -> AsyncIterator[Any]:
    """A kernel client of ``host`` over its Unix socket, in a short temp folder (a socket path
    is at most 108 bytes) that is removed afterwards."""
    import tempfile

    from supervisor.client import open_client
    from supervisor.server.backend import Backend
    from supervisor.server.unix import serve_unix

    with tempfile.TemporaryDirectory(prefix="thsock") as folder:
        path = str(Path(folder) / "h.sock")
        async with trio.open_nursery() as nursery:
            await nursery.start(serve_unix, Backend.of(host), path)
            async with open_client(path) as client:
                yield client
            nursery.cancel_scope.cancel()


async def wait_for(host: Any, pred: Callable[[], Any], timeout: float = 15, what: str = "") -> Any:
    """Wait (on host state changes, not sleeps) until ``pred()`` is truthy; return its value."""
    with trio.fail_after(timeout):
        while True:
            value = pred()
            if value:
                return value
            await host.feed.wait_change()


def effective(host: Any, tool: str) -> str | None:
    d = host.catalog.get(tool)
    return d.stability.effective if d else None


async def wait_available(host: Any, *tools: str, timeout: float = 20) -> None:
    await wait_for(host, lambda: all(effective(host, t) == "available" for t in tools), timeout)


def raw(obj: Any) -> Any:
    import msgspec

    return msgspec.Raw(msgspec.json.encode(obj))


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie is dead for our purposes.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


PYTHON = sys.executable


@asynccontextmanager
async def bystander(host):
    """Keep calling ``echo.say`` (a healthy sidecar next to the one under test); on exit,
    assert every call succeeded."""
    outcomes = []
    stop = trio.Event()

    async def loop():
        while not stop.is_set():
            env = await host.invoker.invoke(InvokeRequest("echo.say", raw({"text": "ok"})))
            outcomes.append(env.status)
            await trio.sleep(0.005)

    async with trio.open_nursery() as n:
        n.start_soon(loop)
        try:
            yield outcomes
        finally:
            stop.set()
    assert outcomes, "the bystander never ran"
    assert set(outcomes) == {"success"}, outcomes


def ready_pids(host: Any, sidecar: str) -> list[int]:
    """Pids of the sidecar's ready workers."""
    pool = host.pools.get(sidecar)
    return [w.pid for w in pool.workers if w.state == "ready"] if pool else []


async def wait_replaced(host: Any, sidecar: str, old_pid: int | None, timeout: float = 20) -> int:
    """Wait until a ready worker other than ``old_pid`` serves ``sidecar``; return its pid.

    A crash no longer makes a tool unavailable (the restart window of PROTOCOL 4), so tests that
    need the replacement wait for it here rather than for availability.
    """
    return await wait_for(
        host, lambda: next((p for p in ready_pids(host, sidecar) if p != old_pid), None), timeout
    )
