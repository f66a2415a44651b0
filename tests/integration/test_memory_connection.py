"""The in-memory kernel connection of in-process faces (``server/memory.py``): a real host, the
kernel client on a :class:`FrameLink`; calls (decoded and raw), a large answer in one frame,
JSON only, the client leaving (the host's end finishes), and the host's end dropping the client
(its pending requests fail with ``ConnectionLost``)."""

from __future__ import annotations

from collections.abc import Callable

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
    """A request is handled at once in the client's task, and its answer reaches the client
    at once in the host's task that ends the call (no hop through either end's reader task);
    a callback failing there is raised in the client's task, and the host goes on serving."""
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
                assert 9 in conn.session._inflight  # handled at once, in this task
                with trio.fail_after(10):
                    await done.wait()
                assert conn.link.on_frame is not None
            assert seen[0][1] is None
            assert "Client._reader" not in seen[0][0], seen

            # A request sent from inside an answer's callback (the host's task) is queued for
            # the host's reader, not handled re-entrantly, and is answered too.
            conn = MemoryConnection(Backend.of(host), "memory-test-nested")
            nursery.start_soon(conn.run)
            answers: list[object] = []
            second = trio.Event()

            def then(result: object, error: BaseException | None) -> None:
                answers.append(result)
                second.set()

            async with client_on_stream(conn.link, name="mem") as kernel:

                def first(result: object, error: BaseException | None) -> None:
                    answers.append(result)
                    kernel.request_soon("tools.invoke", params, request_id=2, on_answer=then)
                    assert 2 not in conn.session._inflight  # queued, not handled in here

                kernel.request_soon("tools.invoke", params, request_id=1, on_answer=first)
                with trio.fail_after(10):
                    await second.wait()
            assert [a["status"] for a in answers] == ["success", "success"]  # type: ignore[index]

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


async def test_a_client_at_its_cap_waits_for_room(app):
    """``host.maxCallsPerClient`` holds on a link too: a request past the cap is not handled
    at once but waits (queued, in order) until one of the client's calls ends."""
    async with running_host(app, {"echo": echo()}, host={"maxCallsPerClient": 1}) as host:
        await wait_available(host, "echo.sleep", "echo.say")
        async with trio.open_nursery() as nursery:
            conn = MemoryConnection(Backend.of(host), "memory-cap")
            nursery.start_soon(conn.run)
            order: list[int] = []
            both = trio.Event()

            def answered(rid: int) -> Callable[[object, BaseException | None], None]:
                def on_answer(result: object, error: BaseException | None) -> None:
                    assert error is None, error
                    order.append(rid)
                    if len(order) == 2:
                        both.set()

                return on_answer

            slow = {"tool": "echo.sleep", "input": {"seconds": 0.3}}
            quick = {"tool": "echo.say", "input": {"text": "after"}}
            async with client_on_stream(conn.link, name="mem") as kernel:
                kernel.request_soon("tools.invoke", slow, request_id=1, on_answer=answered(1))
                kernel.request_soon("tools.invoke", quick, request_id=2, on_answer=answered(2))
                assert list(conn.session._inflight) == [1]  # the second waits for room
                with trio.fail_after(10):
                    await both.wait()
            assert order == [1, 2]
