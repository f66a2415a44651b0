"""lsp.symbols / lsp.diagnostics against a real python-lsp-server, and task.background with real
long-running processes, all through a running host (utility sidecar, bundled manifests)."""

from __future__ import annotations

import importlib.util
import inspect
import json
import os
import signal
import textwrap
from pathlib import Path
from typing import Any

import msgspec
import pytest
import trio

from supervisor.calls.call import InvokeRequest
from supervisor.contracts.rpc import Approval
from tests.conftest import (
    REPO,
    pid_alive,
    raw,
    ready_pids,
    running_host,
    wait_available,
    wait_for,
    wait_replaced,
)
from tests.integration.confine_kit import KERNEL, need

LSP_TOOLS = ["lsp.symbols", "lsp.diagnostics"]
TASK = "task.background"
APPROVED = Approval(granted=True, by="test")

if importlib.util.find_spec("pylsp") is None or importlib.util.find_spec("pyflakes") is None:
    if os.environ.get("CI") == "true":
        raise RuntimeError("python-lsp-server[pyflakes] is missing; CI installs the test extra")
    pytest.skip(
        "python-lsp-server[pyflakes] is not installed (pip install -e '.[test]')",
        allow_module_level=True,
    )

MODULE = textwrap.dedent(
    """\
    import os


    def greet(name):
        return "hello " + name


    class Box:
        def open(self):
            return undefined_thing
    """
)

TICKER = textwrap.dedent(
    """\
    import os, subprocess, sys, time
    if "--grandchild" in sys.argv:
        # A grandchild that ignores SIGTERM: only a group SIGKILL stops it.
        child = subprocess.Popen([sys.executable, "-c",
            "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(120)"])
        print("grandchild", child.pid, flush=True)
    n = int(sys.argv[1])
    for i in range(n):
        print("line", i, flush=True)
        time.sleep(0.05)
    print("done", file=sys.stderr, flush=True)
    sys.exit(int(sys.argv[2]) if len(sys.argv) > 2 and sys.argv[2].isdigit() else 0)
    """
)


def utility(config: dict[str, Any], **extra: Any) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "command": "python",
        "args": ["-m", "sidecars.utility"],
        "tools": ["file.hash", *LSP_TOOLS, TASK],
        "config": config,
        "pool": {"min": 1, "max": 1},
        "probe": {"intervalMs": 200},
        "restart": {"backoffMs": 20, "maxBackoffMs": 200},
        "timeoutMs": 30000,
    }
    entry.update(extra)
    return entry


MANIFESTS = [str(REPO / "manifests")]


def data(env: Any) -> Any:
    assert env.status == "success", (env.status, env.content, env.error)
    return msgspec.json.decode(env.data)


async def task(host: Any, payload: dict[str, Any], approval: Approval | None = APPROVED) -> Any:
    return await host.invoker.invoke(InvokeRequest(TASK, raw(payload), approval=approval))


async def poll(fn: Any, timeout: float = 20) -> Any:
    """Poll ``fn`` (sync or async) until it returns a truthy value: processes and files give no
    event to wait on."""
    with trio.fail_after(timeout):
        while True:
            value = fn()
            if inspect.isawaitable(value):
                value = await value
            if value:
                return value
            await trio.sleep(0.05)


# unavailable before any call -------------------------------------------------------------


async def test_missing_commands_make_the_tools_unavailable_in_probe_and_call(app: Path) -> None:
    config = {"lspCommand": ["no-such-language-server-xyz"]}
    async with running_host(app, {"utility": utility(config)}, manifest_dirs=MANIFESTS) as host:
        await wait_available(host, "file.hash")

        def probed() -> bool:
            return all(
                host.catalog.get(t).stability.probe == "unavailable" for t in [*LSP_TOOLS, TASK]
            )

        await wait_for(host, probed)
        lsp_reason = host.catalog.get("lsp.symbols").stability.reasons
        assert any("no-such-language-server-xyz" in r.message for r in lsp_reason), lsp_reason
        task_reason = host.catalog.get(TASK).stability.reasons
        assert any("config.taskCommand is not set" in r.message for r in task_reason)
        assert host.catalog.get("file.hash").stability.effective == "available"
        # Invisible tools are refused at the gate, never run with a placeholder.
        env = await host.invoker.invoke(InvokeRequest("lsp.symbols", raw({"path": "x.py"})))
        assert env.status == "unavailable"


# lsp -------------------------------------------------------------------------------------


async def test_pylsp_symbols_diagnostics_and_restart(app: Path, project: Path) -> None:
    (project / "pkg").mkdir()
    (project / "pkg" / "mod.py").write_text(MODULE)
    config = {"lspCommand": ["python", "-m", "pylsp"]}
    async with running_host(app, {"utility": utility(config)}, manifest_dirs=MANIFESTS) as host:
        await wait_available(host, *LSP_TOOLS)
        got = data(
            await host.invoker.invoke(InvokeRequest("lsp.symbols", raw({"path": "pkg/mod.py"})))
        )
        by_name = {s["name"]: s for s in got["symbols"]}
        assert by_name["greet"]["kind"] == "function" and by_name["greet"]["start"]["line"] == 3
        assert by_name["Box"]["kind"] == "class"
        assert by_name["open"]["kind"] == "method" and by_name["open"]["container"] == "Box"
        first_pid = got["server"]["pid"]
        assert pid_alive(first_pid) and got["server"]["starts"] == 1

        got = data(
            await host.invoker.invoke(InvokeRequest("lsp.diagnostics", raw({"path": "pkg/mod.py"})))
        )
        assert got["settled"] is True
        undefined = [d for d in got["diagnostics"] if "undefined_thing" in d["message"]]
        assert undefined and undefined[0]["severity"] == "error"
        assert undefined[0]["start"]["line"] == 9

        # The file changes: the next answer describes the new text, not the old one.
        (project / "pkg" / "mod.py").write_text(MODULE.replace("undefined_thing", "self"))
        got = data(
            await host.invoker.invoke(InvokeRequest("lsp.diagnostics", raw({"path": "pkg/mod.py"})))
        )
        assert not [d for d in got["diagnostics"] if "undefined" in d["message"]], got

        # Kill the language server and call at once: whether the call finds it dead before or
        # while talking to it, it starts a new one and answers.
        os.kill(first_pid, signal.SIGKILL)
        got = data(
            await host.invoker.invoke(InvokeRequest("lsp.symbols", raw({"path": "pkg/mod.py"})))
        )
        assert got["server"]["pid"] != first_pid and got["server"]["starts"] == 2
        assert {"greet", "Box", "open"} <= {s["name"] for s in got["symbols"]}
        second_pid = got["server"]["pid"]

        env = await host.invoker.invoke(
            InvokeRequest("lsp.symbols", raw({"path": "../outside.py"}))
        )
        assert env.status == "failed" and env.error.code == "invalid-input"
        assert env.error.details["reason"] == "parent-traversal"
        env = await host.invoker.invoke(
            InvokeRequest("lsp.symbols", raw({"path": "pkg/missing.py"}))
        )
        assert env.status == "failed" and env.error.details["reason"] == "not-found"
    # The worker stopped with the host: its language server did too (no orphan).
    await poll(lambda: not pid_alive(second_pid), timeout=10)


async def test_language_server_dies_with_a_killed_worker(app: Path, project: Path) -> None:
    (project / "mod.py").write_text(MODULE)
    config = {"lspCommand": ["python", "-m", "pylsp"]}
    async with running_host(app, {"utility": utility(config)}, manifest_dirs=MANIFESTS) as host:
        await wait_available(host, *LSP_TOOLS)
        got = data(await host.invoker.invoke(InvokeRequest("lsp.symbols", raw({"path": "mod.py"}))))
        server_pid = got["server"]["pid"]
        [worker_pid] = ready_pids(host, "utility")
        os.kill(worker_pid, signal.SIGKILL)
        await wait_replaced(host, "utility", worker_pid)
        await poll(lambda: not pid_alive(server_pid), timeout=10)
        got = data(await host.invoker.invoke(InvokeRequest("lsp.symbols", raw({"path": "mod.py"}))))
        assert got["server"]["pid"] != server_pid and got["server"]["starts"] == 1


# task.background ---------------------------------------------------------------------------


@pytest.fixture(params=["off", "best-effort"])
def confinement(request: pytest.FixtureRequest) -> str:
    """``host.confinement`` of the task tests: the bundled utility family's profile grants its
    keepers ``confine.keep: host`` (docs/confinement.md), so they behave the same confined."""
    param: str = request.param
    return param


def task_config(**extra: Any) -> dict[str, Any]:
    return {"taskCommand": ["python", "ticker.py"], "cancelGraceMs": 2000, **extra}


def group_members(pgid: int) -> list[int]:
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == pgid and fields[0] != b"Z":
            found.append(int(name))
    return found


async def test_task_runs_grows_and_cancel_kills_its_whole_group(
    app: Path, project: Path, confinement: str
) -> None:
    (project / "ticker.py").write_text(TICKER)
    async with running_host(
        app,
        {"utility": utility(task_config())},
        manifest_dirs=MANIFESTS,
        host={"confinement": confinement},
    ) as host:
        await wait_available(host, TASK)
        # Default sandbox of task.background: approval-required.
        env = await task(host, {"action": "start", "args": ["200"]}, approval=None)
        assert env.status == "unavailable" and env.error.code == "approval-required"

        started = data(await task(host, {"action": "start", "args": ["200", "--grandchild"]}))
        tid, keeper = started["id"], started["pid"]
        assert started["dir"] == f".toolhost/tasks/{tid}"
        state = data(await task(host, {"action": "status", "id": tid}))
        assert state["status"] == "running" and state["args"] == ["200", "--grandchild"]

        async def lines(n: int) -> Any:
            out = data(await task(host, {"action": "output", "id": tid, "offset": 0}))
            return out if out["text"].count("line ") >= n else None

        first = await poll(lambda: lines(3))
        grandchild = int(first["text"].split("grandchild ", 1)[1].split()[0])
        assert pid_alive(grandchild)
        later = await poll(lambda: lines(first["text"].count("line ") + 3))
        assert later["size"] > first["size"] and later["status"] == "running"
        # Paging from an offset returns exactly the bytes after it.
        page = data(
            await task(
                host,
                {"action": "output", "id": tid, "offset": first["size"], "maxBytes": 7},
            )
        )
        assert page["offset"] == first["size"] and len(page["text"]) == 7
        assert (project / ".toolhost" / "tasks" / tid / "stdout.log").is_file()

        cancelled = data(await task(host, {"action": "cancel", "id": tid}))
        assert cancelled["status"] in {"killed", "exited"} and cancelled["reason"] == "cancelled"
        assert not pid_alive(keeper) and not pid_alive(grandchild)
        assert group_members(keeper) == []


async def test_task_exit_code_stderr_cap_and_bad_ids(
    app: Path, project: Path, confinement: str
) -> None:
    (project / "ticker.py").write_text(TICKER)
    config = task_config(maxTasks=1)
    async with running_host(
        app,
        {"utility": utility(config)},
        manifest_dirs=MANIFESTS,
        host={"confinement": confinement},
    ) as host:
        await wait_available(host, TASK)
        tid = data(await task(host, {"action": "start", "args": ["400"]}))["id"]
        env = await task(host, {"action": "start", "args": ["1"]})
        assert env.status == "unavailable" and env.error.details["reason"] == "too-many-tasks"
        data(await task(host, {"action": "cancel", "id": tid}))

        tid = data(await task(host, {"action": "start", "args": ["2", "3"]}))["id"]

        async def ended() -> Any:
            state = data(await task(host, {"action": "status", "id": tid}))
            return state if state["status"] != "running" else None

        state = await poll(ended)
        assert state["status"] == "exited" and state["exitCode"] == 3
        assert state["reason"] == "exited" and state["durationMs"] >= 0
        err = data(await task(host, {"action": "output", "id": tid, "stream": "stderr"}))
        assert err["text"] == "done\n" and err["complete"] is True

        for bad, code, reason in [
            ("../etc", "invalid-input", "bad-id"),
            ("nope-123", "failed", "unknown-task"),
        ]:
            env = await task(host, {"action": "status", "id": bad})
            assert env.status == "failed" and env.error.code == code
            assert env.error.details["reason"] == reason
        env = await task(host, {"action": "output"})
        assert env.status == "failed" and env.error.code == "invalid-input"


async def test_task_survives_a_worker_restart_and_is_reattached(
    app: Path, project: Path, confinement: str
) -> None:
    (project / "ticker.py").write_text(TICKER)
    async with running_host(
        app,
        {"utility": utility(task_config())},
        manifest_dirs=MANIFESTS,
        host={"confinement": confinement},
    ) as host:
        await wait_available(host, TASK)
        started = data(await task(host, {"action": "start", "args": ["400"]}))
        tid, keeper = started["id"], started["pid"]
        [worker_pid] = ready_pids(host, "utility")
        os.kill(worker_pid, signal.SIGKILL)
        await wait_replaced(host, "utility", worker_pid)
        state = data(await task(host, {"action": "status", "id": tid}))
        assert state["status"] == "running" and state["pid"] == keeper
        size = data(await task(host, {"action": "output", "id": tid}))["size"]

        async def grown() -> Any:
            out = data(await task(host, {"action": "output", "id": tid}))
            return out["size"] > size

        await poll(grown)
        cancelled = data(await task(host, {"action": "cancel", "id": tid}))
        assert cancelled["status"] != "running" and not pid_alive(keeper)
        meta = json.loads((project / ".toolhost" / "tasks" / tid / "meta.json").read_text())
        assert meta["pid"] == keeper and meta["argv"][-1] == "400"


async def test_confined_tasks_need_a_project_that_is_not_the_app_root(app: Path) -> None:
    """With ``projectDir: "."`` the tasks' folder is the app root's ``.toolhost/``, which a
    confined sidecar is never granted: ``start`` fails and names the fix."""
    need(KERNEL.landlock_abi >= 1, "Landlock")
    (app / "ticker.py").write_text(TICKER)
    async with running_host(
        app,
        {"utility": utility(task_config())},
        manifest_dirs=MANIFESTS,
        host={"confinement": "best-effort", "projectDir": "."},
    ) as host:
        await wait_available(host, TASK)
        env = await task(host, {"action": "start", "args": ["5"]})
        assert env.status == "failed" and env.error.details["reason"] == "tasks-dir-denied"
        assert "set host.projectDir to a folder of its own" in env.error.message
        assert not (app / ".toolhost" / "tasks").exists()
