"""The live parts of hosted MCP servers (issue 29): resource subscriptions counted per URI
across kernel clients (one subscribe to the owning server, updates to every subscriber, the
server subscribed again when its worker restarts, unsubscribed when the last client goes), in
both eras (a hand-written handshake server that supports ``resources/subscribe``, an SDK server
in the stateless era where the subscription rides on ``subscriptions/listen``); list changes
(a server's ``list_changed``, a sidecar stopped and back) told to kernels as ``offers.changed``;
``notifications/cancelled`` to a server whose read or get the host gave up on; what one MCP
sidecar publishes that another owns, in its status and in ``toolhost doctor``; the face's
lists paged with ``nextCursor``."""

import json
import os
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from supervisor.cli.doctor import examine, render
from supervisor.cli.render import status_text
from supervisor.client import client_on_stream
from supervisor.host.loading import HostOptions
from supervisor.host.offers import HostedOffers, OfferError
from supervisor.mcp_face.face import McpFace, embedded_connector
from supervisor.protocols.mcp_server import Forward, ListTools, McpServerConnection
from supervisor.server import methods
from supervisor.workers import mcp_client
from tests.conftest import (
    FIXTURES,
    free_port,
    running_host,
    wait_available,
    wait_for,
    write_registry,
)
from tests.integration.test_mcp_offers import OffersServer
from tests.kernel import served

LIVE = FIXTURES.parent / "mcp" / "live.py"
OFFERS = FIXTURES.parent / "mcp" / "offers.py"


@asynccontextmanager
async def face_on(host: Any, name: str) -> AsyncIterator[tuple[McpFace, trio.Nursery]]:
    """An MCP face in this process on ``host`` (its kernel connection in memory), its client's
    ``initialize`` already read; the nursery its tasks run in, cancelled at the end."""
    async with trio.open_nursery() as nursery:
        stream = await embedded_connector(host, nursery)()
        async with client_on_stream(stream, name=name) as kernel:
            conn = McpServerConnection()
            init = {"protocolVersion": "2025-11-25", "capabilities": {}}
            msg = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": init}
            conn.feed(json.dumps(msg).encode() + b"\n")
            yield McpFace(conn, kernel, nursery), nursery
        nursery.cancel_scope.cancel()


def live(log: Path) -> dict:
    log.touch()  # Landlock grants what exists at load: an operator creates the file it grants
    return {
        "command": "python",
        "args": [str(LIVE)],
        "protocol": "mcp",
        "env": {"LIVE_LOG": str(log)},
        "confine": {"write": [str(log)]},  # the server's method log, granted as an operator would
        "restart": {"backoffMs": 20, "maxBackoffMs": 200},
        "probe": {"startTimeoutMs": 20_000},
    }


def offers(name: str) -> dict:
    return {
        "command": "python",
        "args": [str(OFFERS)],
        "protocol": "mcp",
        "env": {"OFFERS_NAME": name},
        "restart": {"backoffMs": 20, "maxBackoffMs": 200},
        "probe": {"startTimeoutMs": 20_000},
    }


@pytest.fixture(autouse=True)
def _forget_eras():
    mcp_client.HANDSHAKE_ONLY.clear()
    yield
    mcp_client.HANDSHAKE_ONLY.clear()


class Peer:
    """A kernel peer that keeps the broadcast events, and the answers to other requests, it
    reads while waiting for an answer."""

    def __init__(self, peer: Any) -> None:
        self.peer = peer
        self.events: list[dict] = []
        self.answers: dict[Any, dict] = {}
        self.rid = 100

    async def request(self, method: str, params: Any = None) -> dict:
        self.rid += 1
        rid = self.rid
        await self.peer.send({"id": rid, "method": method, "params": params or {}})
        while True:
            msg = await self.peer.recv()
            if "event" in msg:
                self.events.append(msg)
            elif msg.get("id") == rid:
                return msg
            else:
                self.answers[msg.get("id")] = msg

    async def answer(self, rid: Any, timeout: float = 10) -> dict:
        """The answer to request ``rid`` (sent raw), whether read already or still to come."""
        with trio.fail_after(timeout):
            while rid not in self.answers:
                msg = await self.peer.recv()
                if "event" in msg:
                    self.events.append(msg)
                else:
                    self.answers[msg.get("id")] = msg
        return self.answers.pop(rid)

    async def ok(self, method: str, params: Any = None) -> Any:
        resp = await self.request(method, params)
        assert "error" not in resp, resp
        return resp["result"]

    async def event(self, name: str, timeout: float = 15) -> dict:
        """The next event ``name`` (one already read first)."""
        with trio.fail_after(timeout):
            for i, msg in enumerate(self.events):
                if msg["event"] == name:
                    return self.events.pop(i)["data"]
            while True:
                msg = await self.peer.recv()
                if msg.get("event") == name:
                    return msg["data"]
                self.events.append(msg)


def logged(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


async def until_logged(log: Path, line: str, count: int = 1, timeout: float = 15) -> None:
    """Poll the fixture's log (a file another process writes) until ``line`` is in it
    ``count`` times."""
    with trio.fail_after(timeout):
        while logged(log).count(line) < count:
            await trio.sleep(0.02)


async def test_subscriptions_are_counted_routed_and_renewed(app, tmp_path):
    log = tmp_path / "live.log"
    async with running_host(app, {"live": live(log), "alpha": offers("alpha")}) as host:
        known = HostedOffers(host.views)
        await wait_for(host, lambda: len(known.listed("resources")) == 4, 30)
        assert host.pools["live"].workers[0].conn.era == "handshake"
        assert host.pools["alpha"].workers[0].conn.era == "modern"
        async with (
            served(host, app) as srv,
            srv.peer("unix-json") as raw1,
            srv.peer("unix-json") as raw2,
        ):
            one, two = Peer(raw1), Peer(raw2)
            await one.ok("server.hello")
            await two.ok("server.hello")

            missing = await one.request("resources.subscribe", {"uri": "nowhere://x"})
            assert missing["error"]["code"] == "not-found"

            # Two clients, one subscribe to the server (handshake era: resources/subscribe).
            assert await one.ok("resources.subscribe", {"uri": "live://a"}) == {}
            assert await two.ok("resources.subscribe", {"uri": "live://a"}) == {}
            await until_logged(log, "resources/subscribe live://a")
            assert host.offers.subscriptions() == {
                "live://a": {"sidecar": "live", "subscribers": 2}
            }
            env = await one.ok("tools.invoke", {"tool": "bump", "input": {"uri": "live://a"}})
            assert env["status"] == "success"
            assert await one.event("resource.updated") == {"uri": "live://a"}
            assert await two.event("resource.updated") == {"uri": "live://a"}

            # An update of a URI nobody subscribed to reaches nobody.
            await one.ok("tools.invoke", {"tool": "bump", "input": {"uri": "live://slow"}})
            assert not [e for e in one.events if e["event"] == "resource.updated"]

            # The worker restarts: the new server is subscribed again, updates flow again.
            assert await host.restart_sidecar("live")
            await until_logged(log, "resources/subscribe live://a", count=2)
            await wait_for(host, lambda: len(known.listed("resources")) == 4, 30)
            await one.ok("tools.invoke", {"tool": "bump", "input": {"uri": "live://a"}})
            assert await one.event("resource.updated") == {"uri": "live://a"}
            assert await two.event("resource.updated") == {"uri": "live://a"}

            # The first leaves: still subscribed; the last unsubscribes: the server is told.
            assert await one.ok("resources.unsubscribe", {"uri": "live://a"}) == {}
            assert "resources/unsubscribe live://a" not in logged(log)
            await raw2.stream.aclose()
            await until_logged(log, "resources/unsubscribe live://a")
            assert host.offers.subscriptions() == {}

            # The stateless era: the subscription rides on the server's subscriptions/listen.
            assert await one.ok("resources.subscribe", {"uri": "note://readme"}) == {}
            alpha = host.pools["alpha"].workers[0].mcp
            assert alpha.subscriptions == {"note://readme"}
            touched = None
            with trio.fail_after(20):  # the listen stream is reopened with the URI
                while touched is None:
                    args = {"tool": "touch", "input": {"uri": "note://readme"}}
                    await one.ok("tools.invoke", args)
                    with trio.move_on_after(0.5):
                        touched = await one.event("resource.updated")
            assert touched == {"uri": "note://readme"}

            # Its worker restarts: the new session listens with the URI from the start.
            assert await host.restart_sidecar("alpha")
            await wait_for(host, lambda: len(known.listed("resources")) == 4, 30)
            fresh = host.pools["alpha"].workers[0].mcp
            assert fresh is not alpha and fresh.subscriptions == {"note://readme"}
            one.events.clear()
            touched = None
            with trio.fail_after(20):
                while touched is None:
                    args = {"tool": "touch", "input": {"uri": "note://readme"}}
                    await one.ok("tools.invoke", args)
                    with trio.move_on_after(0.5):
                        touched = await one.event("resource.updated")
            assert touched == {"uri": "note://readme"}


async def test_a_subscription_moves_with_the_owner_of_its_uri(app, tmp_path):
    """Two servers offer ``live://a``; the first in the registry owns it. When it stops, the
    subscription moves to the other (subscribed there, its updates delivered); when it is back,
    the subscription moves back (the other is unsubscribed)."""
    log1, log2 = tmp_path / "one.log", tmp_path / "two.log"
    second = live(log2)
    second["env"]["LIVE_PREFIX"] = "second_"
    second["confine"] = {"write": [str(log2)]}
    async with running_host(app, {"first": live(log1), "second": second}) as host:
        known = HostedOffers(host.views)
        await wait_for(host, lambda: len(known.shadowed(("resources",))) == 2, 30)
        async with served(host, app) as srv, srv.peer("unix-json") as raw:
            peer = Peer(raw)
            await peer.ok("server.hello")
            assert await peer.ok("resources.subscribe", {"uri": "live://a"}) == {}
            await until_logged(log1, "resources/subscribe live://a")
            assert "resources/subscribe live://a" not in logged(log2)

            assert await host.stop_sidecar("first")
            await until_logged(log2, "resources/subscribe live://a")
            assert host.offers.subscriptions()["live://a"]["sidecar"] == "second"
            args = {"tool": "second_bump", "input": {"uri": "live://a"}}
            assert (await peer.ok("tools.invoke", args))["status"] == "success"
            assert await peer.event("resource.updated") == {"uri": "live://a"}

            assert await host.start_sidecar("first")
            await until_logged(log2, "resources/unsubscribe live://a", timeout=30)
            await until_logged(log1, "resources/subscribe live://a", count=2)
            assert host.offers.subscriptions()["live://a"] == {"sidecar": "first", "subscribers": 1}
            peer.events.clear()
            args = {"tool": "bump", "input": {"uri": "live://a"}}
            assert (await peer.ok("tools.invoke", args))["status"] == "success"
            assert await peer.event("resource.updated") == {"uri": "live://a"}


async def test_list_changes_reach_kernels(app, tmp_path):
    log = tmp_path / "live.log"
    async with running_host(app, {"live": live(log)}) as host:
        known = HostedOffers(host.views)
        await wait_for(host, lambda: known.listed("prompts"), 30)
        async with served(host, app) as srv, srv.peer("unix-json") as raw:
            peer = Peer(raw)
            await peer.ok("server.hello")
            await peer.ok("capability.catalog.subscribe")

            # The server announces a new prompt (notifications/prompts/list_changed).
            await peer.ok("tools.invoke", {"tool": "add_prompt", "input": {"name": "fresh"}})
            assert await peer.event("offers.changed") == {"kinds": ["prompts"]}
            names = {p["name"] for p in (await peer.ok("prompts.list"))["prompts"]}
            assert names == {"slow", "fresh"}

            # The sidecar stops: its resources and prompts leave, and kernels are told.
            assert await host.stop_sidecar("live")
            assert await peer.event("offers.changed") == {"kinds": ["resources", "prompts"]}
            assert (await peer.ok("resources.list"))["resources"] == []

            # Back: listed again, and told again.
            assert await host.start_sidecar("live")
            changed = await peer.event("offers.changed", timeout=30)
            assert changed == {"kinds": ["resources", "prompts"]}
            uris = {r["uri"] for r in (await peer.ok("resources.list"))["resources"]}
            assert uris == {"live://a", "live://slow"}


def cancels(log: Path) -> list[int]:
    return [int(line.split()[-1]) for line in logged(log) if line.startswith("notifications/can")]


async def test_a_read_or_get_given_up_on_is_cancelled_at_the_server(app, tmp_path, monkeypatch):
    log = tmp_path / "live.log"
    async with running_host(app, {"live": live(log)}) as host:
        known = HostedOffers(host.views)
        await wait_for(host, lambda: known.listed("prompts"), 30)
        client = host.pools["live"].workers[0].mcp

        # A deadline: the host stops waiting and tells the server which request it dropped.
        with pytest.raises(OfferError) as info:
            await known.request("live", "prompts/get", {"name": "slow"}, timeout_s=0.3)
        assert info.value.code == "unavailable"
        with trio.fail_after(10):
            while not cancels(log):
                await trio.sleep(0.02)
        [rid] = cancels(log)
        assert rid not in client.conn.pending

        # A client that leaves: its read is cancelled in the host, and at the server.
        async with served(host, app) as srv:
            async with srv.peer("unix-json") as raw:
                params = {"uri": "live://slow"}
                await raw.send({"id": 1, "method": "resources.read", "params": params})
                await until_logged(log, "resources/read")
                assert [m for m in client.conn.pending.values() if m == "resources/read"]
            with trio.fail_after(10):
                while len(cancels(log)) < 2:
                    await trio.sleep(0.02)
            assert "resources/read" not in client.conn.pending.values()

        # A kernel's read past its deadline (no task waits for it: a timer ends it).
        monkeypatch.setattr(methods, "DEFAULT_TIMEOUT_S", 0.3)
        async with served(host, app) as srv, srv.peer("unix-json") as raw:
            await raw.send({"id": 2, "method": "resources.read", "params": {"uri": "live://slow"}})
            with trio.fail_after(10):
                msg = await raw.recv()
            assert msg["id"] == 2 and msg["error"]["code"] == "unavailable"
            assert "did not answer resources/read in time" in msg["error"]["message"]
            with trio.fail_after(10):
                while len(cancels(log)) < 3:
                    await trio.sleep(0.02)
            assert "resources/read" not in client.conn.pending.values()
            # The session goes on: a read that is answered.
            await raw.send({"id": 3, "method": "resources.read", "params": {"uri": "live://a"}})
            with trio.fail_after(10):
                msg = await raw.recv()
            assert msg["id"] == 3 and msg["result"]["contents"][0]["uri"] == "live://a"
            # A worker that dies while a read is out: the read ends at once, saying so.
            await raw.send({"id": 4, "method": "resources.read", "params": {"uri": "live://slow"}})
            await until_logged(log, "resources/read", count=4)
            os.kill(client.carrier.pid, signal.SIGKILL)
            with trio.fail_after(10):
                msg = await raw.recv()
            assert msg["id"] == 4 and msg["error"]["code"] == "unavailable"
            assert (
                msg["error"]["message"] == "MCP server live ended before it answered resources/read"
            )


async def test_shadowed_entries_show_in_the_status_and_in_doctor(app):
    reg = {"alpha": offers("alpha"), "beta": offers("beta")}
    async with running_host(app, reg) as host:
        known = HostedOffers(host.views)
        await wait_for(host, lambda: len(known.shadowed()) >= 4, 30)
        statuses = {s.id: s for s in host.views.snapshot().sidecars}
        shadowed = {(r["kind"], r["name"], r["shadowedBy"]) for r in statuses["beta"].shadowed}
        assert ("resource", "note://readme", "alpha") in shadowed
        assert ("resource", "note://shared", "alpha") in shadowed
        assert ("resourceTemplate", "note://page/{name}", "alpha") in shadowed
        assert ("prompt", "greet", "alpha") in shadowed
        assert ("tool", "add_note", "alpha") in shadowed  # the catalog gives it to alpha
        assert statuses["alpha"].shadowed == []
        text = status_text(host.views.snapshot())
        assert "shadowed: resource note://readme of beta (owned by alpha)" in text

    write_registry(app, reg)
    options = HostOptions(app_root=str(app), restart_policy="never", audit=False)
    report = await examine(options, 30)
    by_id = {s.id: s for s in report.sidecars}
    rows = {(r["kind"], r["name"], r["shadowedBy"]) for r in by_id["beta"].shadowed}
    assert ("prompt", "greet", "alpha") in rows and ("resource", "note://readme", "alpha") in rows
    assert by_id["alpha"].shadowed == []
    assert "shadowed: prompt greet of beta (owned by alpha)" in render(report)


async def test_the_faces_lists_are_paged_with_cursors(app, tmp_path):
    log = tmp_path / "live.log"
    async with running_host(app, {"live": live(log)}) as host:
        known = HostedOffers(host.views)
        await wait_for(host, lambda: known.listed("resources"), 30)
        await wait_available(host, "bump", "add_prompt")
        async with face_on(host, "pages") as (face, _):
            conn = face.conn
            face.page_size = 1
            rid = 0

            async def ask(method: str, params: dict) -> dict:
                nonlocal rid
                rid += 1
                msg = {"jsonrpc": "2.0", "id": rid, "method": method, "params": params}
                [ev] = conn.feed(json.dumps(msg).encode() + b"\n")
                if isinstance(ev, ListTools):
                    return json.loads(await face.list_tools(ev.id, ev.cursor))
                assert isinstance(ev, Forward)
                return json.loads(await face.forward(ev))

            async def walk(method: str, key: str, ident: str) -> list[str]:
                names: list[str] = []
                params: dict = {}
                while True:
                    result = (await ask(method, params))["result"]
                    assert len(result[key]) <= 1
                    names += [item[ident] for item in result[key]]
                    if "nextCursor" not in result:
                        return names
                    params = {"cursor": result["nextCursor"]}

            assert sorted(await walk("tools/list", "tools", "name")) == ["add_prompt", "bump"]
            uris = await walk("resources/list", "resources", "uri")
            assert uris == ["live://a", "live://slow"]
            assert await walk("prompts/list", "prompts", "name") == ["slow"]
            bad = await ask("resources/list", {"cursor": "not ours"})
            assert bad["error"]["code"] == -32602
            bad = await ask("tools/list", {"cursor": "not ours"})
            assert bad["error"]["code"] == -32602


@pytest.mark.parametrize("era", ["handshake", "modern"])
async def test_a_server_over_http_is_heard_in_both_eras(app, tmp_path, era):
    """Handshake era: on the session's GET stream; stateless era: on subscriptions/listen,
    reopened with the URI subscribed."""
    port = free_port()
    server = OffersServer(port, tmp_path / "server.log")
    server.start()
    try:
        await server.listening()
        url = f"http://127.0.0.1:{port}/mcp"
        if era == "handshake":
            mcp_client.HANDSHAKE_ONLY[("remote", (url,))] = True  # host it in that era
        entry = {
            "protocol": "mcp-http",
            "url": url,
            "restart": {"backoffMs": 20, "maxBackoffMs": 300},
            "probe": {"startTimeoutMs": 20_000},
        }
        async with running_host(app, {"remote": entry}) as host:
            known = HostedOffers(host.views)
            await wait_for(host, lambda: known.listed("resources"), 30)
            await wait_available(host, "touch", "add_note")
            assert host.pools["remote"].workers[0].conn.era == era
            async with served(host, app) as srv, srv.peer("unix-json") as raw:
                peer = Peer(raw)
                await peer.ok("server.hello")
                await peer.ok("capability.catalog.subscribe")
                assert await peer.ok("resources.subscribe", {"uri": "note://readme"}) == {}
                touched = None
                with trio.fail_after(20):  # once the stream is (re)opened, updates arrive
                    while touched is None:
                        args = {"tool": "touch", "input": {"uri": "note://readme"}}
                        await peer.ok("tools.invoke", args)
                        with trio.move_on_after(0.5):
                            touched = await peer.event("resource.updated")
                assert touched == {"uri": "note://readme"}
                await peer.ok("tools.invoke", {"tool": "add_note", "input": {"name": "fresh"}})
                assert await peer.event("offers.changed") == {"kinds": ["resources"]}
                listed = (await peer.ok("resources.list"))["resources"]
                assert "note://fresh" in {r["uri"] for r in listed}
    finally:
        server.kill()


async def test_a_cancelled_read_is_cancelled_at_the_server(app, tmp_path):
    """``tools.cancel`` of a running ``resources.read`` (a kernel client), and an MCP client's
    ``notifications/cancelled`` of its ``prompts/get`` (the face), both reach the server."""
    log = tmp_path / "live.log"
    async with running_host(app, {"live": live(log)}) as host:
        known = HostedOffers(host.views)
        await wait_for(host, lambda: known.listed("prompts"), 30)
        client = host.pools["live"].workers[0].mcp
        async with served(host, app) as srv, srv.peer("unix-json") as raw:
            peer = Peer(raw)
            await peer.ok("server.hello")
            assert await peer.ok("tools.cancel", {"id": 7}) == {"cancelled": False}
            await raw.send({"id": 7, "method": "resources.read", "params": {"uri": "live://slow"}})
            await until_logged(log, "resources/read")
            assert await peer.ok("tools.cancel", {"id": 7}) == {"cancelled": True}
            msg = await peer.answer(7)
            assert msg["error"]["code"] == "cancelled"
            with trio.fail_after(10):
                while len(cancels(log)) < 1:
                    await trio.sleep(0.02)
            assert "resources/read" not in client.conn.pending.values()

        async with face_on(host, "cancel") as (face, nursery):
            conn = face.conn
            get = {
                "jsonrpc": "2.0",
                "id": 1,
                "method": "prompts/get",
                "params": {"name": "slow"},
            }
            [ev] = conn.feed(json.dumps(get).encode() + b"\n")
            assert isinstance(ev, Forward)
            answers: list = []

            async def run() -> None:
                answers.append(await face.forward(ev))

            nursery.start_soon(run)
            await until_logged(log, "prompts/get")
            note = {"method": "notifications/cancelled", "params": {"requestId": 1}}
            [cancel] = conn.feed(json.dumps({"jsonrpc": "2.0", **note}).encode() + b"\n")
            face.cancel(cancel)
            with trio.fail_after(10):
                while len(cancels(log)) < 2:
                    await trio.sleep(0.02)
                while not answers:
                    await trio.sleep(0.02)
            assert answers == [None]  # MCP: a cancelled request gets no response

            # The stdio face's way: no task of its own, answered from the kernel link's reader.
            written: list[Any] = []
            ended = trio.Event()
            tasks = len(nursery.child_tasks)
            get["id"] = 2
            [ev] = conn.feed(json.dumps(get).encode() + b"\n")
            assert face.forward_now(ev, written.append, ended.set)
            assert len(nursery.child_tasks) == tasks
            await until_logged(log, "prompts/get", count=2)
            note["params"] = {"requestId": 2}
            [cancel] = conn.feed(json.dumps({"jsonrpc": "2.0", **note}).encode() + b"\n")
            face.cancel(cancel)
            with trio.fail_after(10):
                await ended.wait()
                while len(cancels(log)) < 3:
                    await trio.sleep(0.02)
            assert written == []  # cancelled: no response

            read = {"jsonrpc": "2.0", "id": 3, "method": "resources/read"}
            read["params"] = {"uri": "live://a"}
            [ev] = conn.feed(json.dumps(read).encode() + b"\n")
            ended = trio.Event()
            assert face.forward_now(ev, written.append, ended.set)
            with trio.fail_after(10):
                await ended.wait()
            [line] = written
            answer = json.loads(bytes(line))
            assert answer["id"] == 3 and answer["result"]["contents"][0]["uri"] == "live://a"
            listing = {"jsonrpc": "2.0", "id": 4, "method": "resources/list", "params": {}}
            [ev] = conn.feed(json.dumps(listing).encode() + b"\n")
            assert not face.forward_now(ev, written.append)  # a list is paged by forward's task


async def test_an_answer_a_client_cannot_be_sent_is_an_error_not_a_dead_worker(app, tmp_path):
    """A hosted server's answer that is valid JSON but has no MessagePack form (an integer over
    64 bits): a MessagePack client's read of it is answered ``internal``, saying why; the
    server's worker and the client's connection go on (the answer is sent from the worker's
    reading task: what fails there must not end it). One that no client can decode (``1e400``)
    is refused on every connection."""
    log = tmp_path / "live.log"
    entry = live(log)
    entry["env"]["LIVE_BIGINT"] = "1"
    async with running_host(app, {"live": entry}) as host:
        known = HostedOffers(host.views)
        await wait_for(host, lambda: len(known.listed("resources")) == 4, 30)
        pid = host.pools["live"].workers[0].pid
        async with served(host, app) as srv, srv.peer("unix-msgpack") as packed:
            msg = await packed.request(1, "resources.read", {"uri": "live://bigint"})
            assert msg["error"]["code"] == "internal"
            assert "no MessagePack form (ask over JSON)" in msg["error"]["message"]
            msg = await packed.request(2, "resources.read", {"uri": "live://a"})
            assert msg["result"]["contents"] == [{"uri": "live://a", "text": "A"}]
            # A tool whose schema MessagePack cannot carry: unavailable, saying why; the
            # catalog reaches a MessagePack client whole.
            await wait_for(host, lambda: host.catalog.get("huge") is not None, 30)
            tools = (await packed.request(5, "capability.catalog.get"))["result"]["tools"]
            by_name = {t["name"]: t for t in tools}
            huge = by_name["huge"]
            assert huge["visible"] is False and huge["stability"]["effective"] == "unavailable"
            assert huge["stability"]["runtime"] == "schema-error"  # PROTOCOL 4: effective follows
            [reason] = [r for r in huge["stability"]["reasons"] if r["field"] == "runtime"]
            assert reason["code"] == "schema-unportable" and "64" in reason["message"]
            assert by_name["bump"]["stability"]["effective"] == "available"
            async with srv.peer("unix-json") as plain:
                msg = await plain.request(3, "resources.read", {"uri": "live://bigint"})
                assert msg["result"]["_meta"] == {"n": 10**30}
                # A number past a double: no client could decode the frame; refused, saying so.
                for peer in (plain, packed):
                    msg = await peer.request(4, "resources.read", {"uri": "live://inf"})
                    assert msg["error"]["code"] == "failed"
                    assert "cannot read (Number out of range" in msg["error"]["message"]
        assert host.pools["live"].workers[0].pid == pid
