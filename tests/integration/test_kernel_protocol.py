"""PROTOCOL 6 conformance on every transport: Unix JSON, Unix msgpack, WebSocket text and binary."""

import pytest
import trio

from tests.conftest import echo, running_host, script, wait_available
from tests.kernel import served

TRANSPORTS = ["unix-json", "unix-msgpack", "ws-json", "ws-msgpack"]


@pytest.fixture(params=TRANSPORTS)
def transport(request):
    return request.param


async def test_every_method(app, transport):
    async with running_host(
        app, {"echo": echo(tools=["echo.say", "echo.sleep", "echo.fail"])}
    ) as host:
        await wait_available(host, "echo.say", "echo.sleep")
        async with served(host, app) as srv, srv.peer(transport) as peer:
            hello = await peer.request(1, "server.hello", {})
            result = hello["result"]
            assert result["protocol"] == "toolhost/1"
            assert result["server"]["name"] == "toolhost"
            assert {d["name"] for d in result["kits"]["tools"]} >= {"echo.say", "echo.sleep"}

            cat = (await peer.request(2, "capability.catalog.get"))["result"]
            assert cat["revision"] >= 1 and cat["sidecars"][0]["id"] == "echo"
            d = next(d for d in cat["tools"] if d["name"] == "echo.say")
            assert set(d) == {
                "name",
                "description",
                "inputSchema",
                "sidecar",
                "protocol",
                "visible",
                "annotations",
                "stability",
            }
            assert set(d["stability"]) >= {
                "discovery",
                "manifest",
                "path",
                "version",
                "probe",
                "runtime",
                "sandbox",
                "upgrade",
                "effective",
                "reasons",
                "details",
            }

            for fmt, key in [
                ("native", "name"),
                ("openai", "type"),
                ("anthropic", "input_schema"),
                ("mcp", "inputSchema"),
            ]:
                tools = (await peer.request(f"l-{fmt}", "tools.list", {"format": fmt}))["result"][
                    "tools"
                ]
                assert tools and all(key in t for t in tools)
            openai = (await peer.request(3, "tools.list", {"format": "openai"}))["result"]["tools"]
            names = {t["function"]["name"] for t in openai}
            assert "echo__say" in names and all("." not in n for n in names)

            env = (
                await peer.request(4, "tools.invoke", {"tool": "echo.say", "input": {"text": "hi"}})
            )["result"]
            assert env["status"] == "success" and env["data"]["text"] == "hi"
            env = (
                await peer.request(
                    5, "tools.invoke", {"tool": "echo__say", "input": {"text": "alias"}}
                )
            )["result"]
            assert env["status"] == "success" and env["tool"] == "echo.say"
            env = (await peer.request(6, "tools.invoke", {"tool": "nope", "input": {}}))["result"]
            assert env["status"] == "unavailable" and env["error"]["code"] == "unknown-tool"

            # streaming: tool.start then tool.progress events before the envelope
            await peer.send(
                {
                    "id": 7,
                    "method": "tools.invoke",
                    "params": {
                        "tool": "echo.sleep",
                        "input": {"seconds": 0.02, "steps": 2},
                        "stream": True,
                    },
                }
            )
            seen = []
            while True:
                msg = await peer.recv()
                if "event" in msg:
                    assert msg["id"] == 7
                    seen.append(msg["event"])
                    continue
                assert msg["id"] == 7 and msg["result"]["status"] == "success"
                break
            assert seen == ["tool.start", "tool.progress", "tool.progress"]

            health = (await peer.request(8, "system.health"))["result"]
            assert health["status"] == "ok" and health["sidecars"]["available"] == 1
            stats = (await peer.request(9, "system.stats"))["result"]
            assert stats["sidecars"]["echo"]["calls"] >= 3
            logs = (await peer.request(10, "sidecar.logs", {"sidecar": "echo"}))["result"]
            assert logs["sidecar"] == "echo" and isinstance(logs["stderr"], str)
            restarted = (await peer.request(11, "sidecar.restart", {"sidecar": "echo"}))["result"]
            assert restarted["restarted"] is True and len(restarted["replaced"]) == 1


async def test_cancel_and_subscribe(app, transport):
    async with running_host(app, {"echo": echo(tools=["echo.say", "echo.sleep"])}) as host:
        await wait_available(host, "echo.sleep")
        async with served(host, app) as srv, srv.peer(transport) as peer:
            sub = (await peer.request(1, "capability.catalog.subscribe"))["result"]
            rev = sub["revision"]
            await peer.send(
                {
                    "id": 2,
                    "method": "tools.invoke",
                    "params": {
                        "tool": "echo.sleep",
                        "input": {"seconds": 20, "steps": 400},
                        "stream": True,
                    },
                }
            )
            assert (await peer.recv())["event"] == "tool.start"
            await peer.send({"id": 3, "method": "tools.cancel", "params": {"id": 2}})
            got = {}
            while len(got) < 2:
                msg = await peer.recv()
                if "event" not in msg:
                    got[msg["id"]] = msg
            assert got[3]["result"] == {"cancelled": True}
            assert (
                got[2]["result"]["status"] == "failed"
                and got[2]["result"]["error"]["code"] == "cancelled"
            )
            # A restart keeps the tools visible (the restart window): the catalog does not move.
            await peer.send({"id": 4, "method": "sidecar.restart", "params": {"sidecar": "echo"}})
            with trio.fail_after(20):
                while True:
                    msg = await peer.recv()
                    assert msg.get("event") != "catalog.changed", msg
                    if msg.get("id") == 4:
                        assert msg["result"]["restarted"] is True
                        break
            assert host.catalog.revision == rev
            # Stopping and starting the sidecar moves it: the subscriber sees only the changed
            # descriptors.
            await host.stop_sidecar("echo")
            await host.start_sidecar("echo")
            events = []
            with trio.fail_after(20):
                while True:
                    msg = await peer.recv()
                    if msg.get("event") == "catalog.changed":
                        assert "id" not in msg or msg["id"] is None
                        events.append(msg["data"])
                        if msg["data"]["tools"][0]["stability"]["effective"] == "available":
                            break
            assert all(e["revision"] > rev for e in events)
            assert [e["revision"] for e in events] == sorted(e["revision"] for e in events)
            assert all(
                {t["name"] for t in e["tools"]} <= {"echo.say", "echo.sleep"} for e in events
            )


@pytest.mark.parametrize(
    ("frame", "code"),
    [
        ({"method": "tools.list"}, "invalid-request"),
        ({"id": 1, "method": 5}, "invalid-request"),
        ({"id": 1, "method": "no.such.method"}, "unknown-method"),
        ({"id": 1, "method": "tools.list", "params": {"format": "xml"}}, "invalid-params"),
        ({"id": 1, "method": "tools.invoke", "params": {"input": {}}}, "invalid-params"),
        (
            {"id": 1, "method": "tools.invoke", "params": {"tool": "echo.say", "timeoutMs": 0}},
            "invalid-params",
        ),
        ({"id": 1, "method": "sidecar.restart", "params": {"sidecar": "ghost"}}, "not-found"),
        ({"id": 1, "method": "sidecar.logs", "params": {"sidecar": "ghost"}}, "not-found"),
    ],
)
async def test_error_codes(app, transport, frame, code):
    async with running_host(app, {"echo": echo(tools=["echo.say"])}) as host:
        await wait_available(host, "echo.say")
        async with served(host, app) as srv, srv.peer(transport) as peer:
            await peer.send(frame)
            msg = await peer.recv()
            assert msg["error"]["code"] == code, msg
            assert msg["error"]["message"]
            if "id" in frame and isinstance(frame["id"], int):
                assert msg["id"] == frame["id"]
            # the connection lives on
            assert (await peer.request(99, "system.health"))["result"]["status"] == "ok"


async def test_params_error_names_the_path(app):
    reg = {"echo": echo(tools=["echo.say"])}
    async with (
        running_host(app, reg) as host,
        served(host, app) as srv,
        srv.peer("unix-json") as peer,
    ):
        msg = await peer.request(1, "tools.invoke", {"tool": 5})
        assert msg["error"]["message"].startswith("params.tool: expected str")


async def test_duplicate_in_flight_id_refused(app):
    async with running_host(app, {"echo": echo(tools=["echo.sleep"])}) as host:
        await wait_available(host, "echo.sleep")
        async with served(host, app) as srv, srv.peer("unix-json") as peer:
            call = {
                "id": 5,
                "method": "tools.invoke",
                "params": {"tool": "echo.sleep", "input": {"seconds": 0.5}},
            }
            await peer.send(call)
            await peer.send(call)
            first = await peer.recv()
            assert (
                first["error"]["code"] == "invalid-request"
                and "already in flight" in first["error"]["message"]
            )
            second = await peer.recv()
            assert second["result"]["status"] == "success"


async def test_websocket_refuses_missing_or_wrong_token(app):
    from trio_websocket import ConnectionRejected, open_websocket_url

    reg = {"echo": echo(tools=["echo.say"])}
    async with running_host(app, reg) as host, served(host, app) as srv:
        for headers in (
            [],
            [(b"Authorization", b"Bearer wrong")],
            [(b"Authorization", srv.token.encode())],
        ):
            with pytest.raises(ConnectionRejected) as info:
                async with open_websocket_url(
                    f"ws://127.0.0.1:{srv.ws_port}/ws", extra_headers=headers
                ):
                    pass
            assert info.value.status_code == 401
        with pytest.raises(ConnectionRejected) as info:
            async with open_websocket_url(
                f"ws://127.0.0.1:{srv.ws_port}/other",
                extra_headers=[(b"Authorization", f"Bearer {srv.token}".encode())],
            ):
                pass
        assert info.value.status_code == 404
        token_file = app / ".toolhost" / "ws.token"
        assert oct(token_file.stat().st_mode & 0o777) == "0o600"


async def test_msgpack_switch_with_pipelined_frames(app):
    """Bytes that follow the hello in the same write are read in the new framing."""
    import msgspec

    from supervisor.protocols.framing import length_prefixed
    from tests.kernel import UnixPeer

    async with running_host(app, {"echo": echo(tools=["echo.say"])}) as host:
        await wait_available(host, "echo.say")
        async with served(host, app) as srv:
            stream = await trio.open_unix_socket(str(srv.sock))
            async with stream:
                peer = UnixPeer(stream)
                hello = (
                    msgspec.json.encode(
                        {"id": 1, "method": "server.hello", "params": {"encoding": "msgpack"}}
                    )
                    + b"\n"
                )
                call = length_prefixed(
                    msgspec.msgpack.encode(
                        {
                            "id": 2,
                            "method": "tools.invoke",
                            "params": {"tool": "echo.say", "input": {"text": "pipelined"}},
                        }
                    )
                )
                await peer.send_bytes(hello + call)
                first = await peer.recv()
                assert first["id"] == 1 and first["result"]["protocol"] == "toolhost/1"
                peer.switch_to_msgpack()
                second = await peer.recv()
                assert second["id"] == 2 and second["result"]["data"]["text"] == "pipelined"


async def test_a_tool_answer_with_no_msgpack_form_is_an_error_and_everything_goes_on(app):
    """A sidecar's answer that is valid JSON but holds an integer over 64 bits: a MessagePack
    client's ``tools.invoke`` is answered ``internal`` (its progress event says why it has no
    data), a JSON client gets the number; the worker and both connections go on."""
    async with running_host(app, {"big": script("bigint", ["big.int"])}) as host:
        await wait_available(host, "big.int")
        pid = host.pools["big"].workers[0].pid
        async with served(host, app) as srv, srv.peer("unix-msgpack") as packed:
            ask = {"tool": "big.int", "input": {}, "stream": True}
            await packed.send({"id": 1, "method": "tools.invoke", "params": ask})
            seen = []
            with trio.fail_after(10):
                while not seen or "event" in seen[-1]:
                    seen.append(await packed.recv())
            answer, events = seen[-1], {m["event"]: m for m in seen[:-1]}
            assert answer["id"] == 1 and answer["error"]["code"] == "internal"
            assert "no MessagePack form" in answer["error"]["message"]
            assert "no MessagePack form" in events["tool.progress"]["data"]["error"]
            again = await packed.request(2, "tools.invoke", {"tool": "big.int", "input": {}})
            assert again["error"]["code"] == "internal"
            async with srv.peer("unix-json") as plain:
                msg = await plain.request(3, "tools.invoke", {"tool": "big.int", "input": {}})
                assert msg["result"]["data"] == {"n": 10**30}
        assert host.pools["big"].workers[0].pid == pid
