"""Hostile and heavy clients: the host stays healthy for everyone else."""

import msgspec
import trio

from tests.conftest import echo, read_only_manifests, running_host, wait_available
from tests.kernel import UnixPeer, served, unix_peer


async def healthy(srv):
    async with unix_peer(srv.sock) as other:
        resp = await other.request(
            1, "tools.invoke", {"tool": "echo.say", "input": {"text": "fine"}}
        )
        assert resp["result"]["status"] == "success"


async def test_garbage_bytes_get_invalid_request_and_the_connection_lives(app):
    async with running_host(app, {"echo": echo(tools=["echo.say"])}) as host:
        await wait_available(host, "echo.say")
        async with served(host, app) as srv, unix_peer(srv.sock) as peer:
            await peer.send_bytes(b"\x00\xff\xfe garbage {{{\n")
            msg = await peer.recv()
            assert msg["id"] is None and msg["error"]["code"] == "invalid-request"
            await peer.send_bytes(b'["an", "array"]\n')
            assert (await peer.recv())["error"]["code"] == "invalid-request"
            await peer.send_bytes(b'{"id": 7, "method": "tools.list", "params": [1]}\n')
            msg = await peer.recv()
            assert msg["id"] == 7 and msg["error"]["code"] == "invalid-params"
            resp = await peer.request(
                8, "tools.invoke", {"tool": "echo.say", "input": {"text": "after"}}
            )
            assert resp["result"]["status"] == "success"


async def test_oversized_frame_closes_only_that_connection(app):
    async with running_host(app, {"echo": echo(tools=["echo.say"])}) as host:
        await wait_available(host, "echo.say")
        async with served(host, app, max_frame=64 * 1024) as srv:
            async with unix_peer(srv.sock) as bystander, unix_peer(srv.sock) as peer:
                await peer.send_bytes(
                    b'{"id": 1, "method": "x", "params": "' + b"a" * 100_000 + b'"}\n'
                )
                msg = await peer.recv()
                assert (
                    msg["error"]["code"] == "invalid-request"
                    and "too large" in msg["error"]["message"]
                )
                with trio.fail_after(10):
                    try:
                        while True:
                            await peer.recv()
                    except (EOFError, trio.BrokenResourceError):
                        pass
                resp = await bystander.request(2, "system.health")
                assert resp["result"]["status"] == "ok"
            # msgpack frame headers are checked before the body arrives
            async with unix_peer(srv.sock, "msgpack") as mp:
                await mp.send_bytes((10_000_000).to_bytes(4, "big"))
                msg = await mp.recv()
                assert msg["error"]["code"] == "invalid-request"
            await healthy(srv)


async def test_half_frame_then_close(app):
    async with running_host(app, {"echo": echo(tools=["echo.say"])}) as host:
        await wait_available(host, "echo.say")
        async with served(host, app) as srv:
            for _ in range(20):
                stream = await trio.open_unix_socket(str(srv.sock))
                await stream.send_all(b'{"id": 1, "method": "tools.invoke", "params": {"tool": "ec')
                await stream.aclose()
            await healthy(srv)


async def test_client_that_never_reads_is_disconnected_not_buffered(app):
    async with running_host(app, {"echo": echo(tools=["echo.say"])}) as host:
        await wait_available(host, "echo.say")
        async with served(host, app, queue=256 * 1024) as srv:
            stream = await trio.open_unix_socket(str(srv.sock))
            big = "x" * 30_000
            req = msgspec.json.encode(
                {
                    "id": 0,
                    "method": "tools.invoke",
                    "params": {"tool": "echo.say", "input": {"text": big}},
                }
            )
            closed = False
            with trio.fail_after(60):
                for i in range(1, 4000):
                    try:
                        await stream.send_all(req.replace(b'"id":0', b'"id":%d' % i) + b"\n")
                    except (trio.BrokenResourceError, trio.ClosedResourceError):
                        closed = True
                        break
                    if i % 50 == 0:
                        await healthy(srv)  # others are served while this one hogs
            assert closed, "the host kept buffering for a client that never reads"
            await stream.aclose()
            await healthy(srv)


async def test_disconnect_mid_call_cancels_a_read_only_call(app):
    manifests = read_only_manifests(app, ["echo.sleep"])
    reg = {"echo": echo(tools=["echo.say", "echo.sleep"])}
    async with running_host(app, reg, manifest_dirs=manifests) as host:
        await wait_available(host, "echo.sleep")
        async with served(host, app) as srv:
            stream = await trio.open_unix_socket(str(srv.sock))
            peer = UnixPeer(stream)
            await peer.send(
                {
                    "id": 1,
                    "method": "tools.invoke",
                    "params": {
                        "tool": "echo.sleep",
                        "input": {"seconds": 30, "steps": 600},
                        "stream": True,
                    },
                }
            )
            assert (await peer.recv())["event"] == "tool.start"
            pool = host.pools["echo"]
            assert pool.workers[0].inflight == 1
            await stream.aclose()
            # Without a cancel the sidecar would sleep 30 s; it answers within its next 50 ms step.
            with trio.fail_after(10):
                while pool.workers[0].inflight:
                    await trio.sleep(0.01)
            assert host.pools["echo"].statistics().restarts == 0  # cancelled, not killed


async def test_thousands_in_flight_on_one_connection_and_many_clients(app):
    cfg = echo(
        tools=["echo.say", "echo.sleep"], env={"ECHO_CONCURRENCY": "64"}, pool={"queue": 5000}
    )
    async with running_host(app, {"echo": cfg}) as host:
        await wait_available(host, "echo.sleep")
        async with served(host, app) as srv:
            async with unix_peer(srv.sock) as peer:
                n = 2000
                body = b"".join(
                    msgspec.json.encode(
                        {
                            "id": i,
                            "method": "tools.invoke",
                            "params": {"tool": "echo.say", "input": {"text": str(i)}},
                        }
                    )
                    + b"\n"
                    for i in range(1, n + 1)
                )
                await peer.send_bytes(body)
                got = {}
                with trio.fail_after(60):
                    while len(got) < n:
                        msg = await peer.recv()
                        got[msg["id"]] = msg["result"]
                assert all(
                    got[i]["status"] == "success" and got[i]["data"]["text"] == str(i)
                    for i in range(1, n + 1)
                )

            async def client(k):
                async with unix_peer(srv.sock, "msgpack" if k % 2 else "json") as p:
                    for j in range(10):
                        r = await p.request(
                            j, "tools.invoke", {"tool": "echo.say", "input": {"text": f"{k}-{j}"}}
                        )
                        assert r["result"]["data"]["text"] == f"{k}-{j}"

            with trio.fail_after(60):
                async with trio.open_nursery() as n:
                    for k in range(40):
                        n.start_soon(client, k)
