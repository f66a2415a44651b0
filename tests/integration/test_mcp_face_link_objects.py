"""An MCP face in the host's process hands ``tools.invoke`` over as objects, with the same answers.

On the in-memory link the face's params go to the host as the ``InvokeParams`` struct and the
call's envelope comes back as the host's ``Envelope``: nothing is encoded or decoded between the
two (``server/link.py``). On a socket the same face encodes its request and decodes the envelope
typed, in one pass. Either way the MCP client must read the same ``tools/call`` answer: a
success with object data, a failure with the tool's code and partial data, an unknown tool, and
a call outside the face's profile.
"""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest
import trio

from supervisor.client import client_on_stream
from supervisor.contracts.envelope import Envelope
from supervisor.contracts.rpc import InvokeParams, Request
from supervisor.mcp_face.face import McpFace, embedded_connector
from supervisor.protocols.mcp_server import CallTool, McpServerConnection
from supervisor.server import codec as codec_module
from supervisor.server.session import Session
from tests.conftest import echo, running_host, unix_client, wait_available

pytestmark = pytest.mark.trio

CALLS = [
    ("echo.say", b'{"text": "hi"}'),
    ("echo.fail", b'{"message": "no luck"}'),
    ("no.such.tool", b"{}"),
]


def _conn() -> McpServerConnection:
    conn = McpServerConnection()
    init = {"protocolVersion": "2025-11-25", "capabilities": {}}
    msg = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": init}
    conn.feed(json.dumps(msg).encode() + b"\n")
    return conn


async def _answers(face: McpFace) -> list[dict[str, Any]]:
    """Each of :data:`CALLS` through ``face.call_now``: the MCP answers, decoded."""
    out: list[dict[str, Any]] = []
    for i, (tool, args) in enumerate(CALLS, start=1):
        written: list[bytes] = []
        ended = trio.Event()
        call = CallTool(id=i, name=tool, arguments=msgspec.Raw(args))
        assert face.call_now(call, written.append, ended.set)
        with trio.fail_after(20):
            await ended.wait()
        assert len(written) == 1
        out.append(json.loads(written[0]))
    return out


def _comparable(answer: dict[str, Any]) -> dict[str, Any]:
    """An answer without what differs from call to call (timings, the worker's pid)."""
    result = dict(answer["result"])
    meta = dict(result.pop("_meta")["toolhost"])
    for varying in ("durationMs", "pid", "cpuMs"):
        meta.pop(varying, None)
    structured = result.get("structuredContent")
    if isinstance(structured, dict):
        structured = {k: v for k, v in structured.items() if k != "pid"}
        result["structuredContent"] = structured
    return {**result, "meta": meta}


async def test_in_memory_and_socket_faces_answer_alike_and_memory_encodes_nothing(app, monkeypatch):
    frames: list[type] = []
    encoded: list[Any] = []
    real_handle = Session.handle
    real_response = codec_module.Codec.response

    def handle(self: Session, frame: Any, codec: Any) -> None:
        frames.append(type(frame))
        if isinstance(frame, Request) and frame.method == "tools.invoke":
            assert isinstance(frame.params, InvokeParams)  # not JSON: the face's struct
        real_handle(self, frame, codec)

    def response(self: Any, request_id: Any, result: Any) -> bytes:
        encoded.append(result)
        return real_response(self, request_id, result)

    monkeypatch.setattr(Session, "handle", handle)
    monkeypatch.setattr(codec_module.Codec, "response", response)
    async with running_host(app, {"echo": echo()}) as host:
        await wait_available(host, "echo.say", "echo.fail")
        async with trio.open_nursery() as nursery:
            stream = await embedded_connector(host, nursery)()
            async with client_on_stream(stream, name="memory") as kernel:
                frames.clear()
                encoded.clear()
                memory = await _answers(McpFace(_conn(), kernel, nursery))
                assert frames == [Request] * len(CALLS)  # handed over, never a frame
                assert not [e for e in encoded if isinstance(e, Envelope)]  # never encoded
            nursery.cancel_scope.cancel()
        async with unix_client(host) as kernel, trio.open_nursery() as nursery:
            frames.clear()
            encoded.clear()
            socket = await _answers(McpFace(_conn(), kernel, nursery))
            assert frames == [bytes] * len(CALLS)
            assert len([e for e in encoded if isinstance(e, Envelope)]) == len(CALLS)
            nursery.cancel_scope.cancel()
    assert [_comparable(a) for a in memory] == [_comparable(a) for a in socket]
    said, failed, unknown = (a["result"] for a in memory)
    assert said["isError"] is False and said["content"] == [{"type": "text", "text": "hi"}]
    assert said["structuredContent"]["text"] == "hi"
    assert said["_meta"]["toolhost"]["status"] == "success"
    assert failed["isError"] is True
    assert failed["content"][0]["text"] == "[failed] no luck"
    assert failed["structuredContent"]["error"] == {
        "code": "failed",
        "message": "no luck",
        "details": {"asked": True},
    }
    assert failed["structuredContent"]["data"] == {"partial": 1}
    assert unknown["isError"] is True
    assert unknown["structuredContent"]["status"] == "unavailable"
    assert unknown["structuredContent"]["error"]["code"] == "unknown-tool"
