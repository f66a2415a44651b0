"""Per-client fairness (issue 12): a client that floods calls and never reads its answers holds at
most ``host.maxCallsPerClient`` of them, is paused once its answers pile up, and a well-behaved
bystander on another connection is served throughout."""

import msgspec
import trio

from tests.conftest import echo, running_host, wait_available
from tests.kernel import served, unix_peer


async def test_a_flooding_non_reading_client_does_not_starve_a_bystander(app):
    cfg = echo(tools=["echo.say"])  # pool queue 64, one worker
    async with running_host(app, {"echo": cfg}, host={"maxCallsPerClient": 16}) as host:
        await wait_available(host, "echo.say")
        pool = host.pools["echo"]
        async with served(host, app, pause_bytes=256 * 1024, queue=64 << 20) as srv:
            hog = await trio.open_unix_socket(str(srv.sock))
            text = "x" * 20_000
            sent = 0
            deepest = 0

            async def flood():
                nonlocal sent
                for i in range(1, 3001):
                    req = {
                        "id": i,
                        "method": "tools.invoke",
                        "params": {"tool": "echo.say", "input": {"text": text}},
                    }
                    await hog.send_all(msgspec.json.encode(req) + b"\n")
                    sent = i

            statuses = []
            async with trio.open_nursery() as nursery:
                nursery.start_soon(flood)
                async with unix_peer(srv.sock) as bystander:
                    for j in range(60):
                        resp = await bystander.request(
                            j + 1, "tools.invoke", {"tool": "echo.say", "input": {"text": "b"}}
                        )
                        statuses.append(resp["result"]["status"])
                        deepest = max(deepest, pool.queued)
                # The hog is paused: the host stopped reading it long before its 3000 calls.
                sent_then = sent
                await trio.testing.wait_all_tasks_blocked(0.05)
                assert sent == sent_then
                nursery.cancel_scope.cancel()
            assert statuses == ["success"] * 60, statuses
            assert sent < 1000, f"the host kept reading a client that does not read ({sent})"
            assert deepest <= 16 + 1, deepest  # the hog never held more than its share
            await hog.aclose()
            async with unix_peer(srv.sock) as after:
                resp = await after.request(
                    1, "tools.invoke", {"tool": "echo.say", "input": {"text": "a"}}
                )
                assert resp["result"]["status"] == "success"
