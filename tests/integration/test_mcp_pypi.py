"""Real MCP servers from PyPI as sidecars: ``mcp-server-time`` (offline, ``--local-timezone UTC``)
and ``mcp-server-git`` against a temporary repository. Catalog entries, successful calls, an
``isError`` call, the server killed mid-call (the call fails at once), restart."""

import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import msgspec
import trio

from supervisor.calls.call import InvokeRequest
from tests.conftest import pid_alive, raw, running_host, wait_available, wait_for


def server(module, *args, **extra):
    entry = {
        "command": "python",
        "args": ["-m", module, *args],
        "protocol": "mcp",
        "restart": {"backoffMs": 20, "maxBackoffMs": 200},
        "probe": {"startTimeoutMs": 20_000},
    }
    entry.update(extra)
    return entry


async def kill_mid_call(host, sidecar, tool, arguments):
    """Freeze the server, start a call, SIGKILL it: the call must fail at once."""
    worker = host.pools[sidecar].workers[0]
    pid = worker.pid
    os.kill(pid, signal.SIGSTOP)
    out = {}

    async def call():
        out["env"] = await host.invoker.invoke(
            InvokeRequest(tool, raw(arguments), timeout_ms=60_000)
        )

    async with trio.open_nursery() as n:
        n.start_soon(call)
        with trio.fail_after(10):
            while worker.inflight == 0:
                await trio.sleep(0.01)
        t0 = trio.current_time()
        os.kill(pid, signal.SIGKILL)
    env = out["env"]
    assert env.status == "failed" and env.error.code == "worker-crashed", env
    assert trio.current_time() - t0 < 10  # at once, not at the 60 s deadline
    assert env.meta.pid == pid and not pid_alive(pid)
    return pid


async def test_mcp_server_time(app):
    async with running_host(
        app, {"time": server("mcp_server_time", "--local-timezone", "UTC")}
    ) as host:
        await wait_available(host, "get_current_time", "convert_time")
        d = host.catalog.get("convert_time")
        assert d.sidecar == "time" and d.protocol == "mcp"
        assert set(d.inputSchema["required"]) == {"source_timezone", "time", "target_timezone"}
        assert d.annotations.outputSchema["title"] == "TimeConversionResult"
        env = await host.invoker.invoke(
            InvokeRequest("get_current_time", raw({"timezone": "Europe/Paris"}))
        )
        assert env.status == "success", env
        data = msgspec.json.decode(env.data)  # structuredContent
        assert data["timezone"] == "Europe/Paris" and "day_of_week" in data
        env = await host.invoker.invoke(
            InvokeRequest(
                "convert_time",
                raw({"source_timezone": "UTC", "time": "12:00", "target_timezone": "Asia/Tokyo"}),
            )
        )
        assert env.status == "success"
        assert msgspec.json.decode(env.data)["time_difference"] == "+9.0h"
        env = await host.invoker.invoke(
            InvokeRequest("get_current_time", raw({"timezone": "Mars/Olympus_Mons"}))
        )
        assert env.status == "failed" and env.error.code == "failed"
        assert "Invalid timezone" in env.content
        first = await kill_mid_call(host, "time", "get_current_time", {"timezone": "UTC"})
        await wait_for(host, lambda: host.pools["time"].statistics().restarts == 1)
        await wait_available(host, "get_current_time")
        env = await host.invoker.invoke(InvokeRequest("get_current_time", raw({"timezone": "UTC"})))
        assert env.status == "success" and env.meta.pid != first
        assert host.catalog.get("get_current_time").stability.details.restarts == 1


def git(repo, *args):
    subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@example.invalid", *args],
        cwd=repo,
        check=True,
        capture_output=True,
    )


async def test_mcp_server_git(app, tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    (repo / "README.md").write_text("hello\n")
    git(repo, "add", "README.md")
    git(repo, "commit", "-q", "-m", "first commit")
    (repo / "README.md").write_text("hello, world\n")
    # The repository is outside the project: like an operator, the entry grants it (git
    # writes its index there while reading the status), and git's own configuration, which it
    # refuses to run without when the file exists but cannot be read (docs/confinement.md).
    grant: dict[str, Any] = {"write": [str(repo)]}
    gitconfig = Path.home() / ".gitconfig"
    if gitconfig.exists():
        grant["read"] = [str(gitconfig)]
    sidecars = {"git": server("mcp_server_git", "--repository", str(repo), confine=grant)}
    async with running_host(app, sidecars) as host:
        await wait_available(host, "git_status", "git_log", "git_diff_unstaged")
        d = host.catalog.get("git_log")
        assert d.protocol == "mcp" and "repo_path" in d.inputSchema["properties"]
        env = await host.invoker.invoke(InvokeRequest("git_status", raw({"repo_path": str(repo)})))
        assert env.status == "success" and "README.md" in env.content, env
        env = await host.invoker.invoke(InvokeRequest("git_log", raw({"repo_path": str(repo)})))
        assert env.status == "success" and "first commit" in env.content
        env = await host.invoker.invoke(
            InvokeRequest("git_diff_unstaged", raw({"repo_path": str(repo)}))
        )
        assert "+hello, world" in env.content
        env = await host.invoker.invoke(
            InvokeRequest("git_show", raw({"repo_path": str(repo), "revision": "nope"}))
        )
        assert env.status == "failed" and env.error.code == "failed"
        assert "nope" in env.content
        first = await kill_mid_call(host, "git", "git_status", {"repo_path": str(repo)})
        await wait_for(host, lambda: host.pools["git"].statistics().restarts == 1)
        await wait_available(host, "git_status")
        env = await host.invoker.invoke(InvokeRequest("git_status", raw({"repo_path": str(repo)})))
        assert env.status == "success" and env.meta.pid != first


async def test_a_per_tool_manifest_keeps_what_the_server_announces(app):
    # docs/foreign-tools.md section 4: a manifest that only adds settings to an MCP tool.
    folder = app / "manifests"
    folder.mkdir()
    (folder / "time.toml").write_text(
        '[[tool]]\nname = "get_current_time"\nreadOnly = true\ntimeoutMs = 2000\n'
        "retry = { maxAttempts = 3, backoffMs = 200 }\n"
    )
    async with running_host(
        app,
        {"time": server("mcp_server_time", "--local-timezone", "UTC")},
        manifest_dirs=[str(folder)],
    ) as host:
        await wait_available(host, "get_current_time", "convert_time")
        d = host.catalog.get("get_current_time")
        # What the server announces stays...
        assert "current time" in d.description.lower(), d.description
        assert d.inputSchema["required"] == ["timezone"], d.inputSchema
        assert "timezone" in d.inputSchema["properties"]
        assert d.annotations.outputSchema["title"] == "TimeResult"
        # ...and the manifest's settings apply on top.
        assert d.annotations.readOnly is True and d.annotations.timeoutMs == 2000
        manifest = host.catalog.tool_plan("get_current_time").manifest
        assert manifest.retry.max_attempts == 3 and manifest.read_only is True
        env = await host.invoker.invoke(InvokeRequest("get_current_time", raw({"timezone": "UTC"})))
        assert env.status == "success", env
