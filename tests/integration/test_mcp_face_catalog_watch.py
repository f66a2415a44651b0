"""The MCP face's catalog watch keeps up with a burst of ``catalog.changed``: one ``tools/list``
answers every change queued while the last one was asked, so the kernel client's events cannot
pile up behind the face (a hosted server re-listing its tools as fast as the host lets it)."""

from __future__ import annotations

import pytest
import trio

from tests.conftest import echo, running_host, wait_available
from tests.integration.test_mcp_live import face_on

pytestmark = pytest.mark.trio

BURST = 600


async def test_a_burst_of_catalog_changes_costs_a_few_lists_not_one_each(app):
    async with running_host(app, {"echo": echo(tools=["echo.say"])}) as host:
        await wait_available(host, "echo.say")
        async with face_on(host, "watch") as (face, nursery):
            lists = 0
            real_tools = face._tools

            async def counted() -> list:
                nonlocal lists
                lists += 1
                return await real_tools()

            face._tools = counted  # type: ignore[method-assign]
            changed: list[str] = []
            await nursery.start(face.watch_catalog, changed.append)
            lists = 0
            # One change per scheduler pass: the host's forwarder keeps up (one event a
            # pass), the face's tools/list round trips (several passes each) cannot.
            for _ in range(BURST):
                host.feed.publish([], force=True)
                await trio.sleep(0)
            with trio.fail_after(30):
                while face.kernel.events.statistics().current_buffer_used:
                    await trio.sleep(0.01)
                await trio.testing.wait_all_tasks_blocked(0.05)
            assert 1 <= lists < BURST // 5, lists  # one a change: 600
            assert changed == []  # nothing the client sees changed
