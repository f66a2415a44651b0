"""A hosted MCP server that hangs never holds up the gateway's lists (issue 29): ``toolhost
mcp`` (stdio, the stateless era, a kernel client of ``toolhost serve``) answers ``tools/list``
and ``resources/list`` from what the host already knows while one of its hosted servers
(``tests/fixtures/mcp/hanging.py``) is stuck in the host's own ``tools/list`` and
``resources/list``. The hang is an event, not a guess: the server reports on a Unix socket the
moment it starts hanging. Not a timed test (the 50 ms figure is ``bench --only mcp_gateway``)."""

from __future__ import annotations

import socket
from pathlib import Path

import anyio
import pytest

from tests.conftest import FIXTURES, write_registry
from tests.e2e.conftest import serve
from tests.e2e.mcp_client import stdio_client_in

pytestmark = pytest.mark.slow

MCP = FIXTURES.parent / "mcp"
MODERN = "2026-07-28"


def _registry(root: Path, hang_socket: Path) -> None:
    probe = {"startTimeoutMs": 20_000}
    write_registry(
        root,
        {
            "notes": {
                "command": "python",
                "args": [str(MCP / "offers.py")],
                "protocol": "mcp",
                "env": {"OFFERS_NAME": "alpha"},
                "probe": probe,
            },
            "stuck": {
                "command": "python",
                "args": [str(MCP / "hanging.py")],
                "protocol": "mcp",
                "env": {"HANG_SOCKET": str(hang_socket)},
                "probe": probe,
                "confine": {"unix": [str(hang_socket)]},  # its way to tell the test
            },
        },
    )


async def _until(client, want_tools: set[str], want_uris: set[str]) -> None:
    """Wait until both hosted servers are ready and listed (as the other gateway tests do)."""
    with anyio.fail_after(60):
        while True:
            tools = {t.name for t in (await client.list_tools(cache_mode="bypass")).tools}
            listed = (await client.list_resources(cache_mode="bypass")).resources
            if want_tools <= tools and want_uris <= {str(r.uri) for r in listed}:
                return
            await anyio.sleep(0.1)


def test_lists_answer_while_a_hosted_server_hangs(app, tmp_path):
    hang_socket = tmp_path / "hang.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(hang_socket))
    listener.listen(4)
    listener.settimeout(30)  # a thread's accept cannot be cancelled: bound it
    _registry(app, hang_socket)

    async def main() -> None:
        async with stdio_client_in(app, mode="auto") as client:
            assert client.protocol_version == MODERN
            await _until(client, {"hang_lists", "add_note"}, {"note://readme", "stuck://readme"})

            told = await client.call_tool("hang_lists", {})
            assert told.is_error is False

            # The host re-reads the server's lists after its list_changed: the server hangs.
            with anyio.fail_after(30):
                conn, _ = await anyio.to_thread.run_sync(listener.accept)
            conn.settimeout(30)
            with conn, anyio.fail_after(30):
                said = await anyio.to_thread.run_sync(conn.recv, 100)
            assert said.startswith(b"hanging ")

            # Lists come at once from what the host knows: the hanging server's tools and
            # resources as they were, the other server's as they are.
            with anyio.fail_after(10):
                tools = {t.name for t in (await client.list_tools(cache_mode="bypass")).tools}
                listed = (await client.list_resources(cache_mode="bypass")).resources
            assert {"hang_lists", "add_note", "touch"} <= tools
            assert {"note://readme", "note://shared", "stuck://readme"} <= {
                str(r.uri) for r in listed
            }
            # The other server still answers through the same gateway.
            read = await client.read_resource("note://readme", cache_mode="bypass")
            assert read.contents[0].text == "readme of alpha"

    try:
        with serve(app):
            anyio.run(main)
    finally:
        listener.close()
