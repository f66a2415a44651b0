"""A sidecar that a reload removes (or restarts) lets its running calls finish for
``host.shutdownGraceMs``, the drain setting of issue 26 item 17, not a fixed 5 s."""

from __future__ import annotations

import trio

from supervisor.calls.call import InvokeRequest
from tests.conftest import echo, raw, running_host, wait_available, write_registry


async def _call_then_remove(app, grace_ms: int, seconds: float):
    async with running_host(app, {"echo": echo()}, host={"shutdownGraceMs": grace_ms}) as host:
        await wait_available(host, "echo.sleep")
        answers = []
        started = trio.Event()

        async def call() -> None:
            started.set()
            answers.append(
                await host.invoker.invoke(InvokeRequest("echo.sleep", raw({"seconds": seconds})))
            )

        async with trio.open_nursery() as nursery:
            nursery.start_soon(call)
            await started.wait()
            with trio.fail_after(10):  # the call is in the worker (it reports no event for that)
                while not any(w.load for w in host.pools["echo"].workers):
                    await trio.sleep(0.005)
            write_registry(app, {}, host={"shutdownGraceMs": grace_ms})
            result = await host.reload()
            assert result.removed == ["echo"]
        return answers[0]


async def test_a_removed_sidecar_with_no_grace_cuts_its_running_call(app):
    env = await _call_then_remove(app, grace_ms=0, seconds=3)
    assert env.status != "success", env  # a 5 s drain would have let this 3 s call finish


async def test_a_removed_sidecar_lets_a_call_finish_within_the_grace(app):
    env = await _call_then_remove(app, grace_ms=30_000, seconds=0.5)
    assert env.status == "success", env
