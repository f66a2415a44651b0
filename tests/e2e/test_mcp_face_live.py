"""The live parts of ``toolhost mcp`` to the official SDK client (issue 29): resource
subscriptions and list changes of hosted servers, in both eras, over stdio and Streamable HTTP.
A handshake client subscribes with ``resources/subscribe`` and gets
``notifications/resources/updated``; a stateless client names the URI on
``subscriptions/listen`` and gets the update tagged on that stream; both hear
``notifications/prompts/list_changed`` when a hosted server announces a prompt, and
``notifications/resources/list_changed`` when a hosted server dies and comes back; a read the
client gives up on is cancelled at the hosted server."""

from __future__ import annotations

import os
import signal
import warnings
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp.shared.subscriptions import PromptsListChanged, ResourcesListChanged, ResourceUpdated

from tests.conftest import FIXTURES, write_registry
from tests.e2e.conftest import stop
from tests.e2e.mcp_client import http_client_in, start_http, stdio_client_in

pytestmark = pytest.mark.slow

LIVE = FIXTURES.parent / "mcp" / "live.py"


def _registry(root: Path, log: Path) -> None:
    log.touch()  # Landlock grants what exists at load: an operator creates the file it grants
    entry = {
        "command": "python",
        "args": [str(LIVE)],
        "protocol": "mcp",
        "env": {"LIVE_LOG": str(log)},
        "confine": {"write": [str(log)]},  # the server's method log, granted as an operator would
        "restart": {"backoffMs": 20, "maxBackoffMs": 200},
        "probe": {"startTimeoutMs": 20_000},
    }
    write_registry(root, {"live": entry})


class Notes:
    """Every notification the client gets, by method, and a way to wait for the next one."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, Any]] = []
        self._event = anyio.Event()

    async def __call__(self, message: Any) -> None:
        root = getattr(message, "root", message)
        method = getattr(root, "method", None)
        if isinstance(method, str):
            self.seen.append((method, getattr(root, "params", None)))
            self._event.set()
            self._event = anyio.Event()

    async def next(self, method: str, timeout: float = 30) -> Any:
        """The params of the first ``method`` notification not taken yet."""
        with anyio.fail_after(timeout):
            while True:
                for i, (m, params) in enumerate(self.seen):
                    if m == method:
                        del self.seen[i]
                        return params
                await self._event.wait()


async def _until_offered(client: Any) -> None:
    with anyio.fail_after(40):
        while not (await client.list_resources(cache_mode="bypass")).resources:
            await anyio.sleep(0.1)
        while "bump" not in {t.name for t in (await client.list_tools()).tools}:
            await anyio.sleep(0.1)


async def _cancel_a_read(client: Any, log: Path) -> None:
    """A read the client gives up on (stdio: notifications/cancelled; stateless HTTP: the
    request's connection closed) is cancelled at the hosted server."""
    before = log.read_text().count("notifications/cancelled")
    with anyio.move_on_after(1.0):
        await client.read_resource("live://slow", cache_mode="bypass")
    with anyio.fail_after(20):
        while log.read_text().count("notifications/cancelled") <= before:
            await anyio.sleep(0.05)


def _kill_server(log: Path) -> int:
    pid = int([line for line in log.read_text().splitlines() if line.startswith("pid ")][-1][4:])
    os.kill(pid, signal.SIGKILL)
    return pid


async def _handshake(client: Any, notes: Notes, log: Path) -> None:
    assert client.server_capabilities.resources.subscribe is True
    await _until_offered(client)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the SDK marks resources/subscribe deprecated
        await client.subscribe_resource("live://a")
    result = await client.call_tool("bump", {"uri": "live://a"})
    assert result.is_error is False
    updated = await notes.next("notifications/resources/updated")
    assert str(updated.uri) == "live://a"

    await client.call_tool("add_prompt", {"name": "fresh"})
    # A list_changed of the server's start may still be on its way: each one is followed by a
    # list, until the one that shows the new prompt (none: the wait fails).
    names: set[str] = set()
    with anyio.fail_after(30):
        while names != {"slow", "fresh"}:
            await notes.next("notifications/prompts/list_changed")
            names = {p.name for p in (await client.list_prompts(cache_mode="bypass")).prompts}

    _kill_server(log)  # gone (its resources leave), then back (they return): both announced
    await notes.next("notifications/resources/list_changed")
    await _until_offered(client)
    # The restarted server was subscribed again: its updates still arrive.
    with anyio.fail_after(30):
        while log.read_text().count("resources/subscribe live://a") < 2:
            await anyio.sleep(0.05)
    await client.call_tool("bump", {"uri": "live://a"})
    updated = await notes.next("notifications/resources/updated")
    assert str(updated.uri) == "live://a"
    await _cancel_a_read(client, log)


async def _modern(client: Any, log: Path) -> None:
    assert client.protocol_version == "2026-07-28"
    await _until_offered(client)
    async with client.listen(
        resource_subscriptions=["live://a"],
        prompts_list_changed=True,
        resources_list_changed=True,
    ) as sub:
        assert list(sub.honored.resource_subscriptions) == ["live://a"]
        assert sub.honored.prompts_list_changed is True
        await client.call_tool("bump", {"uri": "live://a"})
        with anyio.fail_after(30):
            assert await sub.__anext__() == ResourceUpdated(uri="live://a")
            await client.call_tool("add_prompt", {"name": "fresh"})
            assert await sub.__anext__() == PromptsListChanged()
            _kill_server(log)
            assert await sub.__anext__() == ResourcesListChanged()
    await _until_offered(client)
    await _cancel_a_read(client, log)


@pytest.mark.parametrize("mode", ["auto", "legacy"])
def test_stdio_in_both_eras(app, tmp_path, mode):
    log = tmp_path / "live.log"
    _registry(app, log)

    async def main() -> None:
        notes = Notes()
        async with stdio_client_in(app, "--embedded", mode=mode, watcher=notes) as client:
            if mode == "legacy":
                await _handshake(client, notes, log)
            else:
                await _modern(client, log)

    anyio.run(main)


@pytest.mark.parametrize("mode", ["auto", "legacy"])
def test_http_in_both_eras(app, tmp_path, mode):
    log = tmp_path / "live.log"
    _registry(app, log)
    proc, url = start_http(app, "--embedded")
    try:
        token = (app / ".toolhost" / "mcp.token").read_text().strip()

        async def main() -> None:
            notes = Notes()
            async with http_client_in(url, token, mode=mode, watcher=notes) as client:
                if mode == "legacy":
                    await _handshake(client, notes, log)
                else:
                    await _modern(client, log)

        anyio.run(main)
    finally:
        stop(proc)
