"""A host on a real SDK sidecar: ready, invoke, errors, progress, cancel, deadlines."""

import msgspec
import trio

from supervisor.calls.call import InvokeRequest
from tests.conftest import ECHO_TOOLS, echo, effective, raw, running_host, wait_available


async def test_invoke_roundtrip_and_envelope(app):
    async with running_host(app, {"echo": echo()}) as host:
        await wait_available(host, "echo.say")
        env = await host.invoker.invoke(InvokeRequest("echo.say", raw({"text": "héllo"})))
        assert env.status == "success"
        assert env.content == "héllo"
        data = msgspec.json.decode(env.data)
        assert data["text"] == "héllo"
        assert env.meta.sidecar == "echo" and env.meta.pid == data["pid"]
        assert env.meta.cpuMs is not None and env.meta.cpuMs >= 0
        d = host.catalog.get("echo.say")
        assert d.visible and d.stability.runtime == "ready" and d.stability.probe == "healthy"
        assert d.inputSchema["required"] == ["text"]  # announced by the SDK's ready


async def test_invalid_input_names_the_path(app):
    async with running_host(app, {"echo": echo()}) as host:
        await wait_available(host, "echo.say")
        env = await host.invoker.invoke(InvokeRequest("echo.say", raw({"text": 5})))
        assert env.status == "failed" and env.error.code == "invalid-input"
        assert "$.text" in env.error.message
        # A field it does not take, or one it lacks: the answer names the fields it takes.
        for bad in ({"txt": "hi"}, {}):
            env = await host.invoker.invoke(InvokeRequest("echo.say", raw(bad)))
            assert env.status == "failed" and env.error.code == "invalid-input"
            assert "(fields: text)" in env.error.message, env.error.message
            assert env.error.details == {"fields": ["text"]}


async def test_failure_keeps_data_and_details(app):
    async with running_host(app, {"echo": echo()}) as host:
        await wait_available(host, "echo.fail")
        env = await host.invoker.invoke(InvokeRequest("echo.fail", raw({"message": "nope"})))
        assert (env.status, env.error.code, env.content) == ("failed", "failed", "nope")
        assert msgspec.json.decode(env.data) == {"partial": 1}
        assert env.error.details == {"asked": True}
        env = await host.invoker.invoke(
            InvokeRequest("echo.fail", raw({"code": "unavailable", "message": "no provider"}))
        )
        assert env.status == "unavailable" and env.error.code == "unavailable"


async def test_unknown_tool(app):
    async with running_host(app, {"echo": echo()}) as host:
        env = await host.invoker.invoke(InvokeRequest("no.such", raw({})))
        assert env.status == "unavailable" and env.error.code == "unknown-tool"


async def test_progress_events(app):
    async with running_host(app, {"echo": echo()}) as host:
        await wait_available(host, "echo.sleep")
        seen = []
        env = await host.invoker.invoke(
            InvokeRequest("echo.sleep", raw({"seconds": 0.03, "steps": 3})),
            on_progress=lambda d: seen.append(msgspec.json.decode(d)),
        )
        assert env.status == "success"
        assert seen == [{"step": 1, "of": 3}, {"step": 2, "of": 3}, {"step": 3, "of": 3}]


async def test_deadline_fails_timeout_and_worker_keeps_serving_when_it_answers_cancel(app):
    async with running_host(app, {"echo": echo()}) as host:
        await wait_available(host, "echo.sleep")
        before = host.pools["echo"].workers[0].pid
        env = await host.invoker.invoke(
            InvokeRequest("echo.sleep", raw({"seconds": 5, "steps": 50}), timeout_ms=200)
        )
        assert env.status == "failed" and env.error.code == "timeout"
        # The SDK answers the cancel at once, so the worker is not replaced.
        env = await host.invoker.invoke(InvokeRequest("echo.say", raw({"text": "still"})))
        assert env.status == "success" and env.meta.pid == before
        assert host.pools["echo"].statistics().restarts == 0


async def test_cancel_by_key(app):
    async with running_host(app, {"echo": echo()}) as host:
        await wait_available(host, "echo.sleep")
        out = {}
        started = trio.Event()

        async def call():
            out["env"] = await host.invoker.invoke(
                InvokeRequest("echo.sleep", raw({"seconds": 10, "steps": 100}), key="k1"),
                on_progress=lambda _: started.set(),
            )

        async with trio.open_nursery() as n:
            n.start_soon(call)
            with trio.fail_after(10):
                await started.wait()
            assert host.invoker.cancel("k1") is True
        assert out["env"].status == "failed" and out["env"].error.code == "cancelled"
        assert host.invoker.cancel("k1") is False


async def test_environment_is_allow_listed(app, monkeypatch):
    monkeypatch.setenv("SECRET_TOKEN", "do-not-leak")
    monkeypatch.setenv("SHELL", "/bin/sh")  # not in PROTOCOL 3's list: must not pass
    monkeypatch.setenv("LC_ALL", "C.UTF-8")
    async with running_host(app, {"echo": echo(env={"EXTRA": "1"})}) as host:
        await wait_available(host, "echo.env")
        env = await host.invoker.invoke(InvokeRequest("echo.env", raw({})))
        data = msgspec.json.decode(env.data)
        seen = data["env"]
        assert "SECRET_TOKEN" not in seen and "SHELL" not in seen
        assert seen["EXTRA"] == "1" and seen["LC_ALL"] == "C.UTF-8"
        assert seen["TOOLHOST_SIDECAR"] == "echo" and seen["TOOLHOST_PROTOCOL"] == "process-json"
        assert set(seen) <= {
            "PATH",
            "HOME",
            "LANG",
            "TZ",
            "TMPDIR",
            "EXTRA",
            "TOOLHOST_SIDECAR",
            "TOOLHOST_PROTOCOL",
            "PWD",
        } | {k for k in seen if k.startswith("LC_")}
        assert data["cwd"] == str(app)
        assert data["projectDir"] == str(app / "workspace")  # the default (PROTOCOL 1)


def one_tool_manifest(tmp_path, sidecar, install, tool, description):
    """A manifests folder with ``<sidecar>.toml`` declaring one known tool."""
    mdir = tmp_path / "manifests"
    mdir.mkdir()
    (mdir / f"{sidecar}.toml").write_text(
        f'sidecar = "{sidecar}"\ninstall = "{install}"\n'
        f'[[tool]]\nname = "{tool}"\ndescription = "{description}"\n'
        '[tool.inputSchema]\ntype = "object"\n'
    )
    return mdir


async def test_known_catalog_tools_nobody_serves_are_missing(app, tmp_path):
    mdir = one_tool_manifest(tmp_path, "web", "pip install toolhost-web", "web.search", "Search")
    async with running_host(app, {"echo": echo()}, manifest_dirs=[str(mdir)]) as host:
        d = host.catalog.get("web.search")
        assert d.stability.discovery == "missing" and d.stability.effective == "unavailable"
        assert d.description == "Search" and not d.visible
        assert d.stability.reasons[0].code == "not-configured"
        assert d.stability.details.install == "pip install toolhost-web"
        env = await host.invoker.invoke(InvokeRequest("web.search", raw({})))
        assert env.status == "unavailable" and env.error.code == "not-visible"


async def test_a_known_tool_its_registered_sidecar_does_not_list_says_so(app, tmp_path):
    """The bundled sidecar runs but lists other tools (the bundled registry's utility and
    lsp.symbols): the hint says to add the tool to that entry, not to run `toolhost init`."""
    install = "bundled: `toolhost init` registers it"
    mdir = one_tool_manifest(tmp_path, "echo", install, "echo.extra", "More")
    async with running_host(app, {"echo": echo()}, manifest_dirs=[str(mdir)]) as host:
        reason = host.catalog.get("echo.extra").stability.reasons[0]
        assert reason.code == "not-configured"
        assert reason.hint.startswith("sidecar 'echo' is in the registry but does not list")
        assert "sidecars.echo.tools" in reason.hint


async def test_builtin_names_refused(app):
    async with running_host(app, {"echo": echo(tools=[*ECHO_TOOLS, "git.status"])}) as host:
        await wait_available(host, "echo.say")
        d = host.catalog.get("git.status")
        assert d.stability.manifest == "invalid"
        assert d.stability.reasons[0].code == "duplicates-builtin"
        assert effective(host, "echo.say") == "available"


async def test_sandbox_denied_and_approval(app):
    sb = {"echo.fail": "denied", "echo.say": "approval-required"}
    async with running_host(app, {"echo": echo(sandbox=sb)}) as host:
        await wait_available(host, "echo.say")
        d = host.catalog.get("echo.fail")
        assert d.stability.sandbox == "denied" and not d.visible
        env = await host.invoker.invoke(InvokeRequest("echo.fail", raw({})))
        assert env.status == "unavailable" and env.error.code == "sandbox-denied"
        env = await host.invoker.invoke(InvokeRequest("echo.say", raw({"text": "x"})))
        assert env.status == "unavailable" and env.error.code == "approval-required"
        from supervisor.contracts.rpc import Approval

        env = await host.invoker.invoke(
            InvokeRequest("echo.say", raw({"text": "x"}), approval=Approval(granted=True, by="me"))
        )
        assert env.status == "success"


async def test_disabled_and_unresolved(app):
    sidecars = {
        "off": echo(enabled=False, tools=["off.tool"]),
        "nocmd": {"command": "definitely-not-installed-xyz", "tools": ["nocmd.tool"]},
        "abs": {"command": "/usr/bin/python3", "tools": ["abs.tool"]},
        "esc": {"command": "../../bin/x", "tools": ["esc.tool"]},
    }
    async with running_host(app, sidecars) as host:
        assert host.catalog.get("off.tool").stability.effective == "disabled"
        d = host.catalog.get("nocmd.tool")
        assert (
            d.stability.path == "unresolved" and d.stability.reasons[0].code == "command-not-found"
        )
        assert host.catalog.get("abs.tool").stability.path == "outside-root-denied"
        assert host.catalog.get("esc.tool").stability.path == "outside-root-denied"
        assert host.pools == {}
        h = host.views.health()
        assert h.sidecars.disabled == 1 and h.sidecars.unavailable == 3 and h.status == "degraded"
