"""A hosted server's long answer (past ``MEMBERS_FROM``) reaches every kind of client whole.

The worker decodes such a line with its result's members each left as JSON, in the one pass the
line needs; the in-memory link hands those members to an in-process MCP face as they are (no
frame encoded, no second pass to split them), a socket encodes them as JSON (NDJSON) or decodes
them for MessagePack. Each client must read the same resource, character for character.
"""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
import trio

from supervisor.client import client_on_stream
from supervisor.host.offers import HostedOffers
from supervisor.mcp_face.face import embedded_connector
from supervisor.protocols.mcp import MEMBERS_FROM
from supervisor.server import codec as codec_module
from tests.conftest import running_host, unix_client, wait_for
from tests.integration.test_mcp_offers import offers
from tests.kernel import served

pytestmark = pytest.mark.trio

COUNT = 20_000
URI = f"blob://lines/{COUNT}"
TEXT = "".join(f"line {i} of alpha\n" for i in range(COUNT))


def _text(result: dict[str, Any]) -> str:
    [content] = result["contents"]
    assert content["uri"] == URI
    return str(content["text"])


async def test_a_long_read_reaches_memory_socket_and_msgpack_clients_alike(app, monkeypatch):
    assert len(TEXT) > 2 * MEMBERS_FROM
    encoded: list[Any] = []
    real_response = codec_module.Codec.response

    def response(self: Any, request_id: Any, result: Any) -> bytes:
        encoded.append(result)
        return real_response(self, request_id, result)

    monkeypatch.setattr(codec_module.Codec, "response", response)
    entry = offers("alpha")
    entry["env"]["OFFERS_LONG"] = "1"  # serves blob://lines/{count}
    async with running_host(app, {"alpha": entry}) as host:
        known = HostedOffers(host.views)
        await wait_for(host, lambda: known.listed("resourceTemplates"), 30)
        async with trio.open_nursery() as nursery:
            stream = await embedded_connector(host, nursery)()
            async with client_on_stream(stream, name="memory") as kernel:
                encoded.clear()
                members = await kernel.request("resources.read", {"uri": URI}, members=True)
                assert encoded == []  # handed over as the worker's members, never a frame
                assert type(members) is dict
                assert all(type(v) is msgspec.Raw for v in members.values())
                memory = {k: msgspec.json.decode(v) for k, v in members.items()}
            nursery.cancel_scope.cancel()
        async with unix_client(host) as kernel:
            socket = await kernel.request("resources.read", {"uri": URI})
        async with served(host, app) as srv, srv.peer("unix-msgpack") as peer:  # after hello
            packed = await peer.request(1, "resources.read", {"uri": URI})
    assert _text(memory) == _text(socket) == _text(packed["result"]) == TEXT
