"""A running host and a hostile registry: it keeps serving the last good one and logs one warning
per problem (issue 12)."""

import logging

from supervisor.calls.call import InvokeRequest
from tests.conftest import echo, raw, running_host, wait_available, write_registry


async def test_deeply_nested_registry_on_reload_keeps_the_last_good_one(app, caplog):
    async with running_host(app, {"a": echo(tools=["echo.say"])}) as host:
        await wait_available(host, "echo.say")
        (app / "tools" / "external.tools.jsonc").write_text("[" * 100_000 + "]" * 100_000)
        result = await host.reload()
        assert not result.applied
        assert any("nested deeper than 64 levels" in e for e in result.errors)
        env = await host.invoker.invoke(InvokeRequest("echo.say", raw({"text": "still here"})))
        assert env.status == "success"


async def test_one_warning_per_problem_on_load_and_reload(app, caplog):
    caplog.set_level(logging.WARNING, logger="toolhost.host")
    bad = {"command": "python", "tools": ["bad.tool"], "pool": {"max": 0, "mx": 1}}
    async with running_host(app, {"a": echo(tools=["echo.say"]), "bad": bad}) as host:
        await wait_available(host, "echo.say")
        lines = [r.getMessage() for r in caplog.records if r.name == "toolhost.host"]
        assert "registry: sidecars.bad.pool.max: expected int >= 1, got 0" in lines
        assert "registry: sidecars.bad.pool.mx: unknown field" in lines
        descriptor = host.catalog.get("bad.tool")
        assert descriptor is not None and descriptor.stability.manifest == "invalid"
        caplog.clear()
        write_registry(app, {"a": echo(tools=["echo.say"]), "bad": {**bad, "bogus": 1}})
        await host.reload()
        lines = [r.getMessage() for r in caplog.records if r.name == "toolhost.host"]
        assert "registry: sidecars.bad.bogus: unknown field" in lines
        assert "registry: sidecars.bad.pool.mx: unknown field" in lines
