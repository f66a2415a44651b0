"""The sans-IO process-json connection: fed whole, byte by byte, and with trailing data."""

import re

import msgspec
import pytest

from supervisor.contracts import wire
from supervisor.protocols.errors import LineTooLong, ProtocolError
from supervisor.protocols.process_json import MalformedRequest, ProcessJsonConnection

READY = (
    b'{"type":"ready","protocol":1,"name":"t","version":"1","concurrency":2,'
    b'"tools":[{"name":"a"}]}\n'
)


def ready_conn(**kw):
    c = ProcessJsonConnection(**kw)
    init = c.init(wire.Init(sidecar="t", projectDir="/p", configDir="/c", cwd="/w"))
    assert init.endswith(b"\n") and b'"type":"init"' in init
    assert [type(m) for m in c.feed(READY)] == [wire.Ready]
    assert c.state == "ready" and c.ready.concurrency == 2
    return c


def result_line(call_id, **extra):
    return (
        msgspec.json.encode(
            {"type": "result", "id": call_id, "ok": True, "data": {"x": 1}, **extra}
        )
        + b"\n"
    )


def feed_all(conn, data, mode):
    out = []
    if mode == "whole":
        out += conn.feed(data)
    elif mode == "bytes":
        for i in range(len(data)):
            out += conn.feed(data[i : i + 1])
    else:  # split in two uneven chunks
        out += conn.feed(data[:7])
        out += conn.feed(data[7:])
    return out


@pytest.mark.parametrize("mode", ["whole", "bytes", "split"])
def test_results_any_chunking(mode):
    c = ready_conn()
    id1, line1 = c.call("a", msgspec.Raw(b'{"q":1}'), 1000)
    id2, _ = c.call("a", msgspec.Raw(b"{}"), 1000)
    assert (id1, id2) == (1, 2)
    assert msgspec.json.decode(line1) == {
        "type": "call",
        "id": 1,
        "tool": "a",
        "input": {"q": 1},
        "deadlineMs": 1000,
    }
    data = result_line(2) + b'{"type":"progress","id":1,"data":{"p":1}}\n' + result_line(1)
    msgs = feed_all(c, data, mode)
    assert [type(m).__name__ for m in msgs] == ["Result", "Progress", "Result"]
    assert [m.id for m in msgs] == [2, 1, 1]
    assert bytes(msgs[0].data) == b'{"x":1}'  # data stays raw
    assert c.inflight == set()


def test_trailing_partial_line_waits():
    c = ready_conn()
    cid, _ = c.call("a", msgspec.Raw(b"{}"), 1)
    line = result_line(cid)
    assert c.feed(line[:-5]) == []
    assert len(c.feed(line[-5:])) == 1


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"Loading model...\n", "invalid message on stdout"),
        (b'{"type":"bogus"}\n', "invalid message on stdout"),
        (b'{"type":"result","id":99,"ok":true}\n', "answer for unknown call 99"),
        (b'{"type":"ready","protocol":1}\n', "second ready message"),
        (b'{"type":"progress","id":77}\n', "progress for unknown call 77"),
    ],
)
def test_breaches_raise_and_stick(data, message):
    c = ready_conn()
    with pytest.raises(ProtocolError, match=message):
        c.feed(data)
    assert c.state == "error"
    with pytest.raises(ProtocolError):
        c.feed(result_line(1))


GOOD_REQUEST = {"type": "request", "id": "r1", "callId": 5, "method": "state.get", "params": {}}


@pytest.mark.parametrize(
    ("change", "rid", "problem"),
    [
        ({"method": 123}, "r1", "`method` must be a string, got an integer"),
        ({"method": None}, "r1", "`method` is missing"),
        ({"method": ["x"]}, "r1", "`method` must be a string, got an array"),
        ({"params": [1]}, "r1", "`params` must be an object, got an array"),
        ({"params": "x"}, "r1", "`params` must be an object, got a string"),
        ({"params": None}, "r1", "`params` must be an object, got null"),
        ({"params": 1.5}, "r1", "`params` must be an object, got a number"),
        ({"callId": "5"}, "r1", "`callId` must be an integer, got a string"),
        ({"callId": True}, "r1", "`callId` must be an integer, got a boolean"),
        ({"callId": 5.5}, "r1", "`callId` must be an integer, got a number"),
        ({"callId": {}}, "r1", "`callId` must be an integer, got an object"),
        ({"id": 7}, 7, None),  # an integer id is fine: this one is well formed
        ({"id": 1.5}, None, "`id` must be a string or an integer, got a number"),
        ({"id": False}, None, "`id` must be a string or an integer, got a boolean"),
        ({"id": {"r": 1}}, None, "`id` must be a string or an integer, got an object"),
        ({"id": ["r1"]}, None, "`id` must be a string or an integer, got an array"),
        ({"id": None}, None, "`id` is missing"),
        ({"id": 1.5, "method": 1}, None, "`id` must be .*; `method` must be a string"),
    ],
)
def test_a_malformed_request_is_not_a_breach(change, rid, problem):
    """PROTOCOL 3.5: every field of a request may have the wrong type; the connection hands
    the worker a MalformedRequest to answer ``invalid-request`` on, and stays usable."""
    c = ready_conn()
    line = msgspec.json.encode({**GOOD_REQUEST, **change}) + b"\n"
    (msg,) = c.feed(line)
    if problem is None:
        assert type(msg) is wire.Request and msg.id == rid
    else:
        assert type(msg) is MalformedRequest and msg.id == rid
        assert re.search(problem, msg.problem), msg.problem
    for absent in ("id", "callId", "method"):
        req = {k: v for k, v in GOOD_REQUEST.items() if k != absent}
        (msg,) = c.feed(msgspec.json.encode(req) + b"\n")
        assert type(msg) is MalformedRequest and msg.problem == f"`{absent}` is missing"
    cid, _ = c.call("a", msgspec.Raw(b"{}"), 1)
    assert c.state == "ready" and [m.id for m in c.feed(result_line(cid))] == [cid]


def test_a_request_before_ready_is_still_a_breach():
    c = ProcessJsonConnection()
    with pytest.raises(ProtocolError, match="request before ready"):
        c.feed(msgspec.json.encode({**GOOD_REQUEST, "method": 1}) + b"\n")


def test_messages_before_a_breach_are_kept():
    c = ready_conn()
    cid, _ = c.call("a", msgspec.Raw(b"{}"), 1)
    with pytest.raises(ProtocolError) as info:
        c.feed(result_line(cid) + result_line(cid))
    assert [m.id for m in info.value.accepted] == [cid]


def test_second_answer_is_a_breach():
    c = ready_conn()
    cid, _ = c.call("a", msgspec.Raw(b"{}"), 1)
    c.feed(result_line(cid))
    with pytest.raises(ProtocolError, match=f"second answer for call {cid}"):
        c.feed(result_line(cid))


def test_abandoned_call_answer_accepted_once_then_late_progress_ignored():
    c = ready_conn()
    cid, _ = c.call("a", msgspec.Raw(b"{}"), 1)
    cancel = c.abandon(cid)
    assert msgspec.json.decode(cancel) == {"type": "cancel", "id": cid}
    assert c.feed(b'{"type":"progress","id":%d}\n' % cid) == []
    assert len(c.feed(result_line(cid, ok=False, code="cancelled"))) == 1
    assert c.abandoned == set()


def test_messages_before_ready():
    c = ProcessJsonConnection()
    with pytest.raises(ProtocolError, match="pong before ready"):
        c.feed(b'{"type":"pong","id":"p1"}\n')
    c = ProcessJsonConnection()
    assert [type(m) for m in c.feed(b'{"type":"log","message":"hi"}\n')] == [wire.Log]
    with pytest.raises(ProtocolError, match="cannot call in state starting"):
        c.call("a", msgspec.Raw(b"{}"), 1)


def test_unsupported_protocol_version():
    c = ProcessJsonConnection()
    with pytest.raises(ProtocolError, match="unsupported protocol version 2"):
        c.feed(b'{"type":"ready","protocol":2}\n')


def test_line_limit():
    c = ready_conn(max_line=128)
    with pytest.raises(LineTooLong):
        c.feed(b"x" * 129)
    c = ready_conn(max_line=128)
    with pytest.raises(LineTooLong):
        c.feed(b'{"type":"log","message":"' + b"y" * 120 + b'"}\n')


def test_blank_lines_ignored_and_ping_ids_unique():
    c = ready_conn()
    assert c.feed(b"\n\n") == []
    (p1, l1), (p2, _) = c.ping(), c.ping()
    assert p1 != p2 and msgspec.json.decode(l1) == {"type": "ping", "id": p1}
    pong = c.feed(
        b'{"type":"pong","id":"%s","status":"degraded","tools":{"a":{"status":"unavailable","reason":"r"}}}\n'
        % p1.encode()
    )
    assert pong[0].status == "degraded" and pong[0].tools["a"].reason == "r"
