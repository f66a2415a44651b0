"""Resources, resource templates, prompts and completions of a hosted SDK-written MCP server
(``tests/fixtures/mcp/offers.py``) served on ``toolhost mcp`` to the official SDK client, in both
eras over stdio and in the stateless era over Streamable HTTP; a registry profile hides what is
outside it and refuses a read or get of it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import MCPError
from mcp.types import PromptReference

from tests.conftest import FIXTURES, write_registry
from tests.e2e.conftest import stop
from tests.e2e.mcp_client import http_client_in, start_http, stdio_client_in

pytestmark = pytest.mark.slow

OFFERS = FIXTURES.parent / "mcp" / "offers.py"


def _registry(root: Path, profiles: dict | None = None) -> None:
    entry = {
        "command": "python",
        "args": [str(OFFERS)],
        "protocol": "mcp",
        "env": {"OFFERS_NAME": "alpha"},
        "probe": {"startTimeoutMs": 20_000},
    }
    host = {"mcp": {"profiles": profiles}} if profiles else None
    if host is None:
        write_registry(root, {"notes": entry})
    else:
        write_registry(root, {"notes": entry}, host=host)


async def _resources(client: Any) -> list[Any]:
    with anyio.fail_after(40):
        while True:
            listed = (await client.list_resources(cache_mode="bypass")).resources
            if listed:
                return listed
            await anyio.sleep(0.1)


async def _scenario(client: Any) -> None:
    uris = {str(r.uri) for r in await _resources(client)}
    assert uris == {"note://readme", "note://shared"}
    templates = (await client.list_resource_templates(cache_mode="bypass")).resource_templates
    assert [t.uri_template for t in templates] == ["note://page/{name}"]
    read = await client.read_resource("note://readme", cache_mode="bypass")
    assert read.contents[0].text == "readme of alpha"
    page = await client.read_resource("note://page/intro", cache_mode="bypass")
    assert page.contents[0].text == "page intro from alpha"
    with pytest.raises(MCPError) as exc:
        await client.read_resource("nowhere://x", cache_mode="bypass")
    assert "nowhere://x" in str(exc.value)

    [greet] = (await client.list_prompts(cache_mode="bypass")).prompts
    assert greet.name == "greet" and {a.name for a in greet.arguments} == {"who", "tone"}
    got = await client.get_prompt("greet", {"who": "Ada", "tone": "wry"})
    assert got.messages[0].content.text == "Say hello to Ada in a wry tone (alpha)"
    done = await client.complete(PromptReference(name="greet"), {"name": "tone", "value": "w"})
    assert done.completion.values == ["warm", "witty", "wry"]


@pytest.mark.parametrize("mode", ["auto", "legacy"])
def test_stdio_in_both_eras(app, mode):
    _registry(app)

    async def main() -> None:
        async with stdio_client_in(app, "--embedded", mode=mode) as client:
            caps = client.server_capabilities
            assert caps.resources is not None and caps.prompts is not None
            await _scenario(client)

    anyio.run(main)


def test_http_stateless(app):
    _registry(app)
    proc, url = start_http(app, "--embedded")
    try:
        token = (app / ".toolhost" / "mcp.token").read_text().strip()

        async def main() -> None:
            async with http_client_in(url, token, mode="auto") as client:
                assert client.protocol_version == "2026-07-28"
                await _scenario(client)

        anyio.run(main)
    finally:
        stop(proc)


def test_a_profile_hides_and_refuses(app):
    _registry(app, {"readme": {"tools": [], "resources": ["note://readme"], "prompts": []}})

    async def main() -> None:
        async with stdio_client_in(app, "--embedded", "--profile", "readme", mode="auto") as c:
            assert {str(r.uri) for r in await _resources(c)} == {"note://readme"}
            assert (await c.list_prompts(cache_mode="bypass")).prompts == []
            read = await c.read_resource("note://readme", cache_mode="bypass")
            assert read.contents[0].text == "readme of alpha"
            with pytest.raises(MCPError) as exc:
                await c.read_resource("note://shared", cache_mode="bypass")
            assert str(exc.value) == "resource 'note://shared' is not in profile 'readme'"
            with pytest.raises(MCPError) as exc:
                await c.get_prompt("greet", {"who": "Ada"})
            assert str(exc.value) == "prompt 'greet' is not in profile 'readme'"

    anyio.run(main)
