"""Registry reload: only changed sidecars restart; the others keep serving, no call dropped."""

import json

import msgspec
import pytest
import trio

from supervisor.calls.call import InvokeRequest
from tests.conftest import (
    FIXTURES,
    echo,
    raw,
    ready_pids,
    running_host,
    script,
    wait_available,
    wait_for,
    write_registry,
)


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
                env = await host.invoker.invoke(InvokeRequest("echo.say", raw({"text": "x"})))
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
        env = await host.invoker.invoke(InvokeRequest("echo.say", raw({"text": "still"})))
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
        env = await host.invoker.invoke(InvokeRequest("echo.say", raw({"text": "still"})))
        assert env.status == "success" and env.meta.pid == pid
        await wait_for(host, lambda: host.catalog.get("echo.say").visible)


BASE = {"config": {"keyboardCommand": ["xdotool"], "mode": "a"}, "env": {"RECONF_A": "1"}}
CHANGES = {
    "config": {"config": {"mode": "b"}},  # a key removed, one changed
    "env": {"env": {"RECONF_A": "2", "RECONF_B": "new"}},
    "command": {"args": [str(FIXTURES / "reconf.py"), "--flavour=b"]},
    "pool": {"pool": {"min": 2, "max": 2}},
    "tools": {"tools": ["conf.show", "conf.sleep", "conf.extra"]},
}


def reconf(**change):
    entry = script("reconf", ["conf.show", "conf.sleep"], **BASE)
    entry.update(change)
    return entry


@pytest.mark.parametrize("kind", sorted(CHANGES))
async def test_reload_restarts_a_changed_sidecar_with_its_new_settings(app, kind):
    """Issue 26 item 5: every kind of change to an entry, made while its workers are busy:
    the calls in flight are answered (not lost), and the sidecar is ready again with the new
    settings visible to its workers, never left stopped."""
    async with running_host(app, {"s": reconf()}) as host:
        await wait_available(host, "conf.show", "conf.sleep")
        old_pids = set(ready_pids(host, "s"))
        results = []
        started: list[bytes] = []
        both = trio.Event()

        def on_progress(data):
            started.append(bytes(data))
            if len(started) == 2:
                both.set()

        async with trio.open_nursery() as n:

            async def slow() -> None:
                env = await host.invoker.invoke(
                    InvokeRequest("conf.sleep", raw({"seconds": 1})), on_progress=on_progress
                )
                results.append(env)

            for _ in range(2):
                n.start_soon(slow)
            with trio.fail_after(10):
                await both.wait()  # both calls are running on a worker
            write_registry(app, {"s": reconf(**CHANGES[kind])})
            result = await host.reload()
            assert result.applied and result.restarted == ["s"], result
        # the calls that were running when the reload came finished on the old workers
        assert [e.status for e in results] == ["success", "success"], results
        assert {e.meta.pid for e in results} <= old_pids
        tools = ["conf.show", "conf.sleep"] + (["conf.extra"] if kind == "tools" else [])
        await wait_available(host, *tools)
        snap = host.catalog.get("conf.show").stability
        assert snap.runtime == "ready" and not snap.reasons, snap
        env = await host.invoker.invoke(InvokeRequest("conf.show", raw({})))
        assert env.status == "success", env
        shown = msgspec.json.decode(bytes(env.data))
        assert shown["pid"] not in old_pids
        want = {**BASE, **CHANGES[kind]}
        assert shown["config"] == want["config"]
        assert shown["env"] == want["env"]
        assert shown["argv"] == want.get("args", [str(FIXTURES / "reconf.py")])[1:]
        if kind == "pool":
            await wait_for(host, lambda: len(ready_pids(host, "s")) == 2)
        if kind == "tools":
            assert (
                await host.invoker.invoke(InvokeRequest("conf.extra", raw({})))
            ).status == "success"
        else:
            assert host.catalog.get("conf.extra") is None
        assert host.pools["s"].status().runtime == "ready"


async def test_a_replaced_pool_cannot_leave_the_new_one_stopped(app):
    """Issue 26 item 5, the cause: the pool a reload replaced publishes its last facts
    ("stopped") from its own tasks, which end after the reload has started the new pool; when
    that came after the new worker's ``ready`` (nothing newer to publish), every tool of the
    sidecar stayed ``runtime: failed`` reason ``stopped`` for good. Here the old pool's last
    publish is made to come after the new pool is ready."""
    async with running_host(app, {"s": reconf()}) as host:
        await wait_available(host, "conf.show")
        old = host.pools["s"]
        write_registry(app, {"s": reconf(**CHANGES["config"])})
        assert (await host.reload()).restarted == ["s"]
        await wait_available(host, "conf.show")
        assert host.pools["s"] is not old and old.statistics().stopped
        old._last_facts = None  # so that it publishes again, as its keepers' ``finally`` does
        old._publish()
        snap = host.catalog.get("conf.show").stability
        assert snap.runtime == "ready" and snap.effective == "available", snap.reasons
        assert (await host.invoker.invoke(InvokeRequest("conf.show", raw({})))).status == "success"
