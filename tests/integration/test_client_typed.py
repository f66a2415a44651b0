"""A request made ``typed`` over a socket: the answer's result decoded as the type in one pass;
an answer that does not fit, or an error, is the request's error, never the reader's end."""

from __future__ import annotations

import json

import msgspec
import pytest
import trio

from supervisor.client import RpcError, client_on_stream
from supervisor.contracts.envelope import Envelope

pytestmark = pytest.mark.trio

ENVELOPE = {"status": "success", "tool": "t", "content": "hi", "data": {"a": [1, 2]}}


async def _fake_host(stream: trio.SocketStream, answers: list[dict]) -> None:
    """Reads one request per answer and answers it with the next one, under its id."""
    buffer = b""
    for answer in answers:
        while b"\n" not in buffer:
            buffer += await stream.receive_some(65536)
        line, buffer = buffer.split(b"\n", 1)
        rid = json.loads(line)["id"]
        await stream.send_all(json.dumps({"id": rid, **answer}).encode() + b"\n")


async def test_typed_answers_over_a_socket():
    a, b = trio.socket.socketpair()
    host_end, client_end = trio.SocketStream(a), trio.SocketStream(b)
    answers = [
        {"result": ENVELOPE},
        {"result": None},
        {"result": {"status": "success"}},
        {"error": {"code": "unknown-tool", "message": "no tool named 'x'"}},
        {"result": ENVELOPE},
    ]
    async with trio.open_nursery() as nursery, client_on_stream(client_end, hello=False) as client:
        nursery.start_soon(_fake_host, host_end, answers)
        got = await client.request("tools.invoke", {"tool": "t"}, typed=Envelope)
        assert isinstance(got, Envelope) and got.content == "hi"
        assert msgspec.json.decode(got.data) == {"a": [1, 2]}  # data kept as the JSON it was
        for _ in range(2):  # null, and an object without the envelope's fields
            with pytest.raises(RpcError) as bad:
                await client.request("tools.invoke", {"tool": "t"}, typed=Envelope)
            assert bad.value.code == "internal" and "does not fit Envelope" in bad.value.message
        with pytest.raises(RpcError) as refused:
            await client.request("tools.invoke", {"tool": "x"}, typed=Envelope)
        assert refused.value.code == "unknown-tool"
        answered: list = []
        done = trio.Event()
        client.request_soon(
            "tools.invoke",
            {"tool": "t"},
            request_id=99,
            on_answer=lambda result, error: (answered.append((result, error)), done.set()),
            typed=Envelope,
        )
        await done.wait()
        ((result, error),) = answered
        assert error is None and isinstance(result, Envelope) and result.tool == "t"
        assert client._raw == 0  # nothing left counted as waiting for JSON
        nursery.cancel_scope.cancel()
