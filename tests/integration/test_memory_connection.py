"""The in-memory kernel connection of in-process faces (``server/memory.py``): a real host, the
kernel client on a :class:`FrameLink`; calls (decoded and raw), a large answer in one frame,
JSON only, the client leaving (the host's end finishes), and the host's end dropping the client
(its pending requests fail with ``ConnectionLost``)."""

from __future__ import annotations

import msgspec
import pytest
import trio

from supervisor.client import ConnectionLost, client_on_stream
from supervisor.server.backend import Backend
from supervisor.server.memory import MemoryConnection
from tests.conftest import echo, running_host, wait_available


async def test_calls_big_answers_and_leaving(app):
    async with running_host(app, {"echo": echo()}) as host:
        await wait_available(host, "echo.say", "echo.sleep")
        backend = Backend.of(host)
        async with trio.open_nursery() as nursery:
            conn = MemoryConnection(backend, "memory-test")
            nursery.start_soon(conn.run)
            async with client_on_stream(conn.link, name="mem") as kernel:
                assert kernel.server["protocol"]
                env = await kernel.invoke("echo.say", {"text": "hi"})
                assert env.status == "success", env
                big = "x" * 60_000  # under the 64 KiB output limit, over a socket read
                env = await kernel.invoke("echo.say", {"text": big})
                assert env.status == "success"
                assert big in env.content
                raw = await kernel.request(
                    "tools.invoke", {"tool": "echo.say", "input": {"text": big}}, raw=True
                )
                assert isinstance(raw, msgspec.Raw)
                assert big in msgspec.json.decode(raw)["content"]
                names = {t["name"] for t in await kernel.tools("native")}
                assert "echo.say" in names
                with pytest.raises(ValueError, match="JSON only"):
                    await kernel.hello(encoding="msgpack")
            # The client left: the host's end finished and the session is closed.
            with trio.fail_after(10):
                while not conn.session.closed:
                    await trio.sleep(0.01)
            assert conn.link.closed


async def test_host_end_closing_fails_pending_requests(app):
    async with running_host(app, {"echo": echo()}) as host:
        await wait_available(host, "echo.sleep")
        async with trio.open_nursery() as nursery:
            conn = MemoryConnection(Backend.of(host), "memory-test")
            nursery.start_soon(conn.run)
            async with client_on_stream(conn.link, name="mem") as kernel:
                outcome: list[BaseException] = []

                async def slow() -> None:
                    try:
                        await kernel.invoke("echo.sleep", {"seconds": 20})
                    except ConnectionLost as exc:
                        outcome.append(exc)

                async with trio.open_nursery() as inner:
                    inner.start_soon(slow)
                    with trio.fail_after(10):
                        while not conn.session._inflight:
                            await trio.sleep(0.01)
                    conn.disconnect("test: the host drops the client")
                assert len(outcome) == 1
                assert isinstance(outcome[0], ConnectionLost)


def _leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in _leaves(inner)]
    return [exc]


async def test_answers_come_from_the_host_task_and_a_failing_callback_stays_in_the_client(app):
    """An answer reaches the client at once, in the host's task that ends the call (no hop
    through the client's reader task); a callback failing there is raised in the client's
    task, and the host goes on serving."""
    async with running_host(app, {"echo": echo()}) as host:
        await wait_available(host, "echo.say")
        async with trio.open_nursery() as nursery:
            conn = MemoryConnection(Backend.of(host), "memory-test")
            nursery.start_soon(conn.run)
            seen: list[tuple[str, BaseException | None]] = []
            done = trio.Event()

            def answered(result: object, error: BaseException | None) -> None:
                seen.append((trio.lowlevel.current_task().name, error))
                done.set()

            params = {"tool": "echo.say", "input": {"text": "at once"}}
            async with client_on_stream(conn.link, name="mem") as kernel:
                kernel.request_soon("tools.invoke", params, request_id=9, on_answer=answered)
                with trio.fail_after(10):
                    await done.wait()
                assert conn.link.on_frame is not None
            assert seen[0][1] is None
            assert "Client._reader" not in seen[0][0], seen

            def broken(result: object, error: BaseException | None) -> None:
                raise RuntimeError("the callback broke")

            conn = MemoryConnection(Backend.of(host), "memory-test-2")
            nursery.start_soon(conn.run)
            with pytest.raises(BaseException) as info:  # a group or the error itself
                async with client_on_stream(conn.link, name="mem") as kernel:
                    kernel.request_soon("tools.invoke", params, request_id=1, on_answer=broken)
                    with trio.fail_after(10):
                        await trio.sleep_forever()
            assert [str(e) for e in _leaves(info.value)] == ["the callback broke"]
            conn = MemoryConnection(Backend.of(host), "memory-test-3")
            nursery.start_soon(conn.run)
            async with client_on_stream(conn.link, name="mem") as kernel:
                env = await kernel.invoke("echo.say", {"text": "still serving"})
                assert env.status == "success", env
