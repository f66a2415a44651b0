"""Security first (issue 30) through ``toolhost mcp``: the four red-team attacks, sent by the
official MCP SDK client to the bundled utility sidecar with ``projectDir: "."``, are refused with
``host-private`` and leave the host's files byte-identical."""

from __future__ import annotations

import anyio
import pytest

from tests.e2e.mcp_client import Watcher, stdio_session, text_of
from tests.integration.test_host_private import (
    ATTACKS,
    SECRET,
    app_with_bundled_tools,
    unchanged,
)

pytestmark = pytest.mark.slow


def test_the_four_attacks_are_refused_through_toolhost_mcp(app):
    before = app_with_bundled_tools(app, project_dir=".")

    async def main() -> None:
        watcher = Watcher()
        async with stdio_session(app, "--embedded", watcher=watcher) as session:
            while True:  # the utility sidecar may still be starting: list_changed says when
                seen = watcher.list_changed
                if "data.convert" in {t.name for t in (await session.list_tools()).tools}:
                    break
                await watcher.beyond(seen, timeout=60)
            for attack in ATTACKS:
                got = await session.call_tool("data.convert", attack)
                assert got.is_error is True, text_of(got)
                error = got.structured_content["error"]
                assert error["code"] == "invalid-input"
                assert error["details"]["reason"] == "host-private"
                assert SECRET not in text_of(got)

    anyio.run(main)
    unchanged(app, before)
