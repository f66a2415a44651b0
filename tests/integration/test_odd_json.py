"""A sidecar's valid JSON that is hard to carry (numbers past 64 bits or past a double, a lone
surrogate, nesting past the host's depth limit, duplicate keys, long escape runs), as progress
and as the answer, to JSON and MessagePack kernel clients at once: every call is answered (a
result, or an error saying why), nothing ends the host or a connection, and what JSON can
carry reaches a JSON client as the sidecar wrote it."""

from typing import Any

import msgspec
import trio

from tests.conftest import running_host, script, wait_available
from tests.fixtures.sidecars.odd_json import CASES
from tests.kernel import served

# What each case ends as, on a JSON connection and on a MessagePack one: the data itself, the
# RPC error ``internal`` (no MessagePack form), a failed envelope (``protocol-error``: the
# host refused the sidecar's line, or withheld JSON no client can read), or the text cut at
# ``maxOutputBytes``.
EXPECTED = {
    0: ("data", "internal"),  # over 64 bits
    1: ("data", "internal"),  # under int64
    2: ("data", "internal"),  # over uint64
    3: ("protocol-error", "protocol-error"),  # 1e400
    4: ("data", "data"),  # -1E-400: -0.0
    5: ("protocol-error", "protocol-error"),  # a lone surrogate
    6: ("data", "data"),
    7: ("data", "data"),  # a duplicate key: the last one
    8: ("data", "data"),
    9: ("data", "data"),  # 900 deep
    10: ("protocol-error", "protocol-error"),  # 5000 deep
    11: ("data", "internal"),
    12: ("truncated", "truncated"),  # 80 KB of escapes, over the 64 KiB default
}


async def _ask(peer: Any, rid: int, case: int) -> tuple[list, dict]:
    """Stream one call; its events and its answer."""
    params = {"tool": "odd.value", "input": {"case": case}, "stream": True}
    await peer.send({"id": rid, "method": "tools.invoke", "params": params})
    events: list = []
    with trio.fail_after(15):
        while True:
            msg = await peer.recv()
            if "event" in msg:
                events.append(msg)
            elif msg.get("id") == rid:
                return events, msg


def _outcome(answer: dict) -> str:
    if "error" in answer:
        assert answer["error"]["message"], answer
        return str(answer["error"]["code"])
    env = answer["result"]
    if env["status"] != "success":
        assert env["error"]["message"], env
        return str(env["error"]["code"])
    if env["meta"].get("truncated"):
        assert env["data"] is None and "truncated" in env["content"]
        return "truncated"
    return "data"


async def test_odd_json_from_a_sidecar_is_answered_on_every_connection(app):
    assert len(EXPECTED) == len(CASES)
    async with running_host(app, {"odd": script("odd_json", ["odd.value", "odd.count"])}) as host:
        await wait_available(host, "odd.value")
        async with (
            served(host, app) as srv,
            srv.peer("unix-json") as plain,
            srv.peer("unix-msgpack") as packed,
        ):
            got = {}
            for case, value in enumerate(CASES):
                outcomes = []
                for peer in (plain, packed):
                    events, answer = await _ask(peer, 100 + case, case)
                    outcomes.append(_outcome(answer))
                    if peer is plain and outcomes[-1] == "data":  # as the sidecar wrote it
                        assert answer["result"]["data"] == msgspec.json.decode(value), case
                    if value == b"1e400":  # its progress event too: withheld, saying why
                        [progress] = [e for e in events if e["event"] == "tool.progress"]
                        assert "Number out of range" in progress["data"]["error"]
                        message = answer["result"]["error"]["message"]
                        assert "Number out of range" in message and "withheld" in message
                got[case] = tuple(outcomes)
            assert got == EXPECTED
            # Everything still works, on both connections.
            for peer in (plain, packed):
                msg = await peer.request(1, "tools.invoke", {"tool": "odd.count", "input": {}})
                assert msg["result"]["data"] == len(CASES)
