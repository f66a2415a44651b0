"""Both eras as a client of hosted MCP servers (issue 29): ``server/discover`` first, the
handshake as the fallback. An SDK server (``tests/fixtures/mcp/server.py``) is hosted in the
stateless era (no session, ``server/discover`` as the probe, ``subscriptions/listen`` bringing
``tools/list_changed``); a hand-written handshake-only server is hosted whether it answers the
unknown method with an error, never answers it, or exits on it (then it is remembered as
handshake-only and not probed again, so it does not crash-loop)."""

import msgspec
import pytest
import trio

from supervisor.calls.call import InvokeRequest
from supervisor.workers import mcp_client
from tests.conftest import FIXTURES, raw, running_host, wait_available, wait_for

SERVER = FIXTURES.parent / "mcp" / "server.py"
LEGACY = FIXTURES.parent / "mcp" / "legacy.py"


async def test_a_stateless_server_slow_to_start_is_hosted_in_its_era(app, monkeypatch):
    """The discover is given up on (the server reads nothing yet), the handshake follows; the
    server then answers the discover and refuses the initialize: the session takes the late
    answer and is stateless, instead of failing the start."""
    monkeypatch.setattr(mcp_client, "DISCOVER_MAX_S", 0.5)
    entry = {
        "command": "python",
        "args": [str(SERVER)],
        "protocol": "mcp",
        "env": {"SLOW_START_S": "1.5"},
        "probe": {"startTimeoutMs": 20_000},
    }
    async with running_host(app, {"fx": entry}) as host:
        await wait_available(host, "whoami", timeout=30)
        worker = host.pools["fx"].workers[0]
        assert worker.conn.era == "modern" and worker.conn.protocol_version == "2026-07-28"
        env = await host.invoker.invoke(InvokeRequest("whoami", raw({})))
        assert env.status == "success"
        assert host.pools["fx"].status().restarts == 0


def legacy(mode: str, log, start_ms: int = 4000) -> dict:
    log.touch()  # the server appends to it: confined, it may write that file only (granted)
    return {
        "command": "python",
        "args": [str(LEGACY)],
        "protocol": "mcp",
        "env": {"LEGACY_MODE": mode, "LEGACY_LOG": str(log)},
        "confine": {"write": [str(log)]},
        "restart": {"backoffMs": 20, "maxBackoffMs": 200},
        "probe": {"startTimeoutMs": start_ms},
    }


@pytest.fixture(autouse=True)
def _forget_eras():
    mcp_client.HANDSHAKE_ONLY.clear()
    yield
    mcp_client.HANDSHAKE_ONLY.clear()


async def test_an_sdk_server_is_hosted_in_the_stateless_era(app):
    entry = {
        "command": "python",
        "args": [str(SERVER)],
        "protocol": "mcp",
        "probe": {"startTimeoutMs": 20_000, "intervalMs": 200, "failureThreshold": 1},
    }
    async with running_host(app, {"fx": entry}) as host:
        await wait_available(host, "whoami", "grow")
        worker = host.pools["fx"].workers[0]
        assert worker.conn.era == "modern" and worker.conn.protocol_version == "2026-07-28"
        listens = [m for m in worker.conn.pending.values() if m == "subscriptions/listen"]
        assert listens == ["subscriptions/listen"]  # one stream open for change notifications
        pong = await worker.ping(5)
        assert pong is not None and pong.status == "healthy"  # server/discover is the probe
        env = await host.invoker.invoke(InvokeRequest("grow", raw({"name": "sprout"})))
        assert env.status == "success"
        await wait_available(host, "sprout")  # list_changed came over subscriptions/listen
        env = await host.invoker.invoke(InvokeRequest("sprout", raw({})))
        assert env.status == "success" and env.content == "sprout says hi"


async def test_a_legacy_server_answering_an_error_falls_back_to_the_handshake(app, tmp_path):
    log = tmp_path / "methods"
    async with running_host(app, {"old": legacy("error", log)}) as host:
        await wait_available(host, "legacy_echo")
        worker = host.pools["old"].workers[0]
        assert worker.conn.era == "handshake"
        env = await host.invoker.invoke(InvokeRequest("legacy_echo", raw({"a": 1})))
        assert env.status == "success" and msgspec.json.decode(env.content) == {"a": 1}
        methods = log.read_text().split()
        assert methods[:3] == ["server/discover", "initialize", "notifications/initialized"]
        assert "notifications/cancelled" not in methods


async def test_a_legacy_server_that_never_answers_falls_back_after_half_the_start(app, tmp_path):
    log = tmp_path / "methods"
    async with running_host(app, {"old": legacy("silent", log, start_ms=2000)}) as host:
        started = trio.current_time()
        await wait_available(host, "legacy_echo")
        assert trio.current_time() - started < 10
        worker = host.pools["old"].workers[0]
        assert worker.conn.era == "handshake"
        assert host.pools["old"].statistics().restarts == 0
        methods = log.read_text().split()
        assert methods[:2] == ["server/discover", "initialize"]
        assert "notifications/cancelled" not in methods  # the probe is never cancelled


async def test_a_legacy_server_exiting_on_discover_is_remembered_as_handshake_only(app, tmp_path):
    log = tmp_path / "methods"
    async with running_host(app, {"old": legacy("exit", log)}) as host:
        await wait_available(host, "legacy_echo", timeout=30)
        env = await host.invoker.invoke(InvokeRequest("legacy_echo", raw({"b": 2})))
        assert env.status == "success" and msgspec.json.decode(env.content) == {"b": 2}
        methods = log.read_text().split()
        assert methods.count("server/discover") == 1  # probed once, never again
        assert methods[:4] == [
            "server/discover",  # the first process exited on it; the next one was not probed
            "initialize",
            "notifications/initialized",
            "tools/list",
        ]
        pool = host.pools["old"]
        restarts = pool.statistics().restarts
        await trio.sleep(0.5)
        assert pool.statistics().restarts == restarts  # no crash loop
        await wait_for(host, lambda: host.pools["old"].workers[0].conn.era == "handshake")
