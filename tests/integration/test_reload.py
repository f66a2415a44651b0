"""Registry reload: only changed sidecars restart; the others keep serving, no call dropped."""

import json

import trio

from tests.conftest import echo, raw, running_host, script, wait_available, wait_for, write_registry


async def test_reload_restarts_only_the_changed_sidecar(app):
    sidecars = {"a": echo(tools=["echo.say"]), "b": script("echo", ["echo.sleep"])}
    async with running_host(app, sidecars) as host:
        await wait_available(host, "echo.say", "echo.sleep")
        a_pid = host.pools["a"].workers[0].pid
        b_pid = host.pools["b"].workers[0].pid
        statuses = []
        done = trio.Event()

        async def keep_calling():
            while not done.is_set():
                env = await host.invoke("echo.say", raw({"text": "x"}))
                statuses.append((env.status, env.meta.pid))

        async with trio.open_nursery() as n:
            n.start_soon(keep_calling)
            changed = {**sidecars, "b": script("echo", ["echo.sleep"], env={"NEW": "1"})}
            write_registry(app, changed)
            result = await host.reload()
            assert result.applied and result.restarted == ["b"] and result.unchanged == ["a"]
            await wait_available(host, "echo.sleep")
            for _ in range(20):
                await trio.sleep(0.005)
            done.set()
        assert statuses and all(s == ("success", a_pid) for s in statuses)  # same worker throughout
        assert host.pools["a"].workers[0].pid == a_pid
        assert host.pools["b"].workers[0].pid != b_pid


async def test_reload_adds_and_removes(app):
    async with running_host(app, {"a": echo(tools=["echo.say"])}) as host:
        await wait_available(host, "echo.say")
        rev = host.catalog.revision
        write_registry(app, {"c": script("echo", ["echo.fail"])})
        result = await host.reload()
        assert result.added == ["c"] and result.removed == ["a"]
        await wait_available(host, "echo.fail")
        assert host.catalog.get("echo.say") is None and "a" not in host.pools
        assert host.catalog.revision > rev


async def test_unparseable_registry_keeps_everything(app):
    async with running_host(app, {"a": echo(tools=["echo.say"])}) as host:
        await wait_available(host, "echo.say")
        pid = host.pools["a"].workers[0].pid
        (app / "tools" / "external.tools.jsonc").write_text("{ broken")
        result = await host.reload()
        assert not result.applied and "not valid JSONC" in result.errors[0]
        env = await host.invoke("echo.say", raw({"text": "still"}))
        assert env.status == "success" and env.meta.pid == pid


async def test_invalid_new_entry_keeps_the_old_configuration_running(app):
    async with running_host(app, {"a": echo(tools=["echo.say"])}) as host:
        await wait_available(host, "echo.say")
        pid = host.pools["a"].workers[0].pid
        bad = {**echo(tools=["echo.say"]), "pool": {"max": "many"}}
        (app / "tools" / "external.tools.jsonc").write_text(
            json.dumps({"schemaVersion": 2, "sidecars": {"a": bad}})
        )
        result = await host.reload()
        assert result.applied
        assert any(
            "sidecars.a.pool.max" in e and "previous configuration" in e for e in result.errors
        )
        env = await host.invoke("echo.say", raw({"text": "still"}))
        assert env.status == "success" and env.meta.pid == pid
        await wait_for(host, lambda: host.catalog.get("echo.say").visible)
