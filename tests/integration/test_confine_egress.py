"""The egress proxy (PROTOCOL 7) with real sockets: CONNECT and absolute-form HTTP to a local
server, refusals (403 naming the rule, audited), identity by listener and by token, hostile
clients, and a confined program that reaches the network only through it."""

from __future__ import annotations

import base64
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from supervisor.contracts.confine import EgressRecord, Profile
from supervisor.contracts.registry import NetworkGrant
from supervisor.host.egress import Client, EgressLimits, EgressProxy, client_for
from supervisor.policy.egress import IPAddress, literal_address
from supervisor.processes.confine import SidecarWalls
from tests.integration.confine_kit import (
    KERNEL,
    make_world,
    need,
    shim_argv,
)

PAGE = b"x" * 100_000


async def http_server(nursery: trio.Nursery, body: bytes = PAGE) -> tuple[int, list[bytes]]:
    """A tiny HTTP/1.1 server on loopback answering every request with ``body``; returns its
    port and the list of request heads it got."""
    listener = (await trio.open_tcp_listeners(0, host="127.0.0.1"))[0]
    seen: list[bytes] = []

    async def handle(stream: trio.SocketStream) -> None:
        buf = b""
        async with stream:
            while b"\r\n\r\n" not in buf:
                data = await stream.receive_some(4096)
                if not data:
                    return
                buf += data
            seen.append(buf.split(b"\r\n\r\n")[0])
            head = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % len(body)
            await stream.send_all(head + body)

    nursery.start_soon(trio.serve_listeners, handle, [listener])
    return listener.socket.getsockname()[1], seen


def names(table: dict[str, list[str]]):  # type: ignore[no-untyped-def]
    async def resolve(host: str, port: int) -> list[IPAddress]:
        found = literal_address(host)
        if found is not None:
            return [found]
        return [a for a in (literal_address(x) for x in table.get(host, [])) if a is not None]

    return resolve


async def request(port: int, data: bytes, *, read_all: bool = True) -> bytes:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(data)
        out = b""
        while read_all and (chunk := await stream.receive_some(65536)):
            out += chunk
        return out


async def start(nursery: trio.Nursery, **kw: object) -> tuple[EgressProxy, list[EgressRecord]]:
    audit: list[EgressRecord] = []
    proxy = EgressProxy(audit=audit.append, **kw)  # type: ignore[arg-type]
    await nursery.start(proxy.run)
    return proxy, audit


def auth(token: str) -> bytes:
    return b"Proxy-Authorization: Basic " + base64.b64encode(f"toolhost:{token}".encode()) + b"\r\n"


async def test_connect_and_plain_http_through_the_proxy_with_audit_and_stats() -> None:
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            web, seen = await http_server(nursery)
            proxy, audit = await start(nursery, resolver=names({"local.test": ["127.0.0.2"]}))
            port = await proxy.open_shared()
            rules = [f"127.0.0.1:{web}", f"local.test:{web}"]
            token = proxy.add_token(client_for("web", rules, worker="web#1"))
            # CONNECT: a tunnel, bytes both ways
            out = await request(
                port,
                b"CONNECT 127.0.0.1:%d HTTP/1.1\r\n%s\r\nGET / HTTP/1.1\r\nHost: x\r\n\r\n"
                % (web, auth(token)),
            )
            assert out.startswith(b"HTTP/1.1 200 Connection established\r\n\r\nHTTP/1.1 200 OK")
            assert out.endswith(PAGE)
            # absolute form: forwarded with Host set to what was checked, credentials stripped
            out = await request(
                port,
                b"GET http://127.0.0.1:%d/page?q=1 HTTP/1.1\r\nHost: evil.test\r\n%s\r\n"
                % (web, auth(token)),
            )
            assert out.startswith(b"HTTP/1.1 200 OK") and out.endswith(PAGE)
            last = seen[-1]
            assert last.startswith(b"GET /page?q=1 HTTP/1.1\r\nHost: 127.0.0.1:%d" % web)
            assert b"evil.test" not in last and b"Proxy-Authorization" not in last
            # a name that resolves to loopback: refused, though a rule names it
            out = await request(
                port, b"CONNECT local.test:%d HTTP/1.1\r\n%s\r\n" % (web, auth(token))
            )
            assert out.startswith(b"HTTP/1.1 403 Forbidden")
            assert b"confine.network.allow" in out and b"(loopback)" in out
            # another port: no rule
            out = await request(port, b"CONNECT 127.0.0.1:1 HTTP/1.1\r\n%s\r\n" % auth(token))
            assert (
                out.startswith(b"HTTP/1.1 403") and b"matches no confine.network.allow rule" in out
            )
            nursery.cancel_scope.cancel()
    allowed = [r for r in audit if r.allowed]
    refused = [r for r in audit if not r.allowed]
    assert [r.method for r in allowed] == ["CONNECT", "GET"]
    assert all(r.sidecar == "web" and r.worker == "web#1" and r.port == web for r in allowed)
    assert allowed[0].bytes_in > len(PAGE) and allowed[0].rule == f"127.0.0.1:{web}"
    assert [r.rule for r in refused] == ["loopback-address", "no-rule"]
    line = json.loads(msgspec_json(audit[0]))
    assert set(line) >= {
        "event",
        "sidecar",
        "host",
        "port",
        "allowed",
        "rule",
        "bytesIn",
        "bytesOut",
    }
    stats = proxy.statistics()["web"]
    assert (stats.connections, stats.refused, stats.open) == (2, 2, 0)
    assert stats.bytes_in > 2 * len(PAGE)


def msgspec_json(record: EgressRecord) -> bytes:
    import msgspec

    return msgspec.json.encode(record)


async def test_unknown_or_missing_credentials_get_407_and_reach_nothing() -> None:
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            web, seen = await http_server(nursery)
            proxy, audit = await start(nursery)
            port = await proxy.open_shared()
            token = proxy.add_token(client_for("s", [f"127.0.0.1:{web}"]))
            for creds in (
                b"",
                auth("forged"),
                auth(token[:-1]),
                b"Proxy-Authorization: Bearer x\r\n",
            ):
                out = await request(port, b"CONNECT 127.0.0.1:%d HTTP/1.1\r\n%s\r\n" % (web, creds))
                assert out.startswith(b"HTTP/1.1 407") and b"Proxy-Authenticate: Basic" in out
            proxy.forget("s")
            out = await request(
                port, b"CONNECT 127.0.0.1:%d HTTP/1.1\r\n%s\r\n" % (web, auth(token))
            )
            assert out.startswith(b"HTTP/1.1 407")  # a forgotten worker's token is dead
            nursery.cancel_scope.cancel()
    assert seen == [] and audit == []


async def test_a_workers_own_listener_is_its_identity() -> None:
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            web, _ = await http_server(nursery)
            proxy, audit = await start(nursery)
            mine = socket.socket()
            mine.bind(("127.0.0.1", 0))
            mine.listen(8)
            port = mine.getsockname()[1]
            proxy.serve_listener(
                mine,
                Client(
                    sidecar="a", worker="a#1", rules=client_for("a", [f"127.0.0.1:{web}"]).rules
                ),
            )
            out = await request(port, b"GET http://127.0.0.1:%d/ HTTP/1.1\r\n\r\n" % web)
            assert out.startswith(b"HTTP/1.1 200 OK")
            proxy.forget("a#1")
            await trio.testing.wait_all_tasks_blocked()
            with pytest.raises(OSError):
                await request(port, b"GET http://127.0.0.1:%d/ HTTP/1.1\r\n\r\n" % web)
            nursery.cancel_scope.cancel()
    assert [(r.sidecar, r.worker, r.allowed) for r in audit] == [("a", "a#1", True)]


async def test_hostile_clients_are_cut_short() -> None:
    limits = EgressLimits(max_head=1024, head_timeout_s=0.5, idle_timeout_s=0.5, per_sidecar=1)
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            web, _ = await http_server(nursery)
            proxy, audit = await start(nursery, limits=limits)
            port = await proxy.open_shared()
            token = proxy.add_token(client_for("h", [f"127.0.0.1:{web}", "*"]))
            # a head that never ends
            assert (await request(port, b"CONNECT 127.0.0.1:80 HTTP/1.1\r\n")).startswith(
                b"HTTP/1.1 408"
            )
            # a head over the limit
            big = b"CONNECT 127.0.0.1:80 HTTP/1.1\r\n" + b"X-Pad: " + b"a" * 4096 + b"\r\n\r\n"
            assert (await request(port, big)).startswith(b"HTTP/1.1 431")
            for bad in (
                b"GARBAGE\r\n\r\n",
                b"GET /relative HTTP/1.1\r\n\r\n",
                b"GET https://x.test/ HTTP/1.1\r\n\r\n",
                b"CONNECT 127.0.0.1 HTTP/1.1\r\n\r\n",
                b"CONNECT a b:1 HTTP/1.1\r\n\r\n",
                b"GET http://u:p@x.test/ HTTP/1.1\r\n\r\n",
                b"GET http://x.test/ HTTP/1.1\r\nContent-Length: 1\r\n"
                b"Transfer-Encoding: chunked\r\n\r\n",
                b"GET http://x.test/ HTTP/1.1\r\n folded\r\n\r\n",
            ):
                out = await request(port, bad)
                assert out.startswith((b"HTTP/1.1 400", b"HTTP/1.1 407")), (bad, out)
            # an idle tunnel is closed; a second connection while it is open is refused (503)
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            await stream.send_all(b"CONNECT 127.0.0.1:%d HTTP/1.1\r\n%s\r\n" % (web, auth(token)))
            assert (await stream.receive_some(100)).startswith(b"HTTP/1.1 200")
            out = await request(
                port, b"CONNECT 127.0.0.1:%d HTTP/1.1\r\n%s\r\n" % (web, auth(token))
            )
            assert out.startswith(b"HTTP/1.1 503")
            with trio.fail_after(5):  # the idle timeout closes it
                while await stream.receive_some(100):
                    pass
            await stream.aclose()
            nursery.cancel_scope.cancel()
    assert [r.rule for r in audit if not r.allowed] == ["too-many-connections"]


async def test_a_confined_program_reaches_the_network_only_through_the_proxy(
    tmp_path: Path,
) -> None:
    """The issue's end-to-end case: with ``network.allow`` the hostile reaches an allowed
    loopback HTTP server only through the proxy (its listener inside the worker's namespace),
    is refused (403, audited) for another port, and reaches nothing directly."""
    need(KERNEL.netns != "" and KERNEL.landlock_abi >= 6, "network namespaces and Landlock ABI 6")
    world = make_world(tmp_path)
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            web, seen = await http_server(nursery)
            other, _ = await http_server(nursery)
            proxy, audit = await start(nursery)
            plan = world.plan(Profile(network=NetworkGrant(allow=[f"127.0.0.1:{web}"])))
            shared = SidecarWalls(plan, tmp_root=str(world.tmpdir))
            for listener in shared.listeners.values():  # the host serves the namespace's port
                proxy.serve_listener(listener.dup(), client_for("hostile", plan.allow, "hostile"))
            walls, _ = shared.worker()
            r, w = os.pipe()
            os.write(w, walls.dumps())
            os.close(w)
            script = (
                "import json, urllib.request, urllib.error, socket\n"
                "out = {}\n"
                "def get(url):\n"
                "    try:\n"
                "        with urllib.request.urlopen(url, timeout=10) as f: return len(f.read())\n"
                "    except urllib.error.HTTPError as e: return e.code\n"
                "    except OSError as e: return type(e).__name__\n"
                f"out['allowed'] = get('http://127.0.0.1:{web}/')\n"
                f"out['other'] = get('http://127.0.0.1:{other}/')\n"
                "try:\n"
                f"    socket.create_connection(('127.0.0.1', {web}), timeout=2)\n"
                "    out['direct'] = 'ok'\n"
                "except OSError as e: out['direct'] = type(e).__name__\n"
                "print(json.dumps(out))\n"
            )
            env = {**world.env(), "HTTP_PROXY": f"http://127.0.0.1:{plan.proxy_port}"}

            def run() -> subprocess.CompletedProcess[bytes]:
                return subprocess.run(
                    shim_argv([sys.executable, "-c", script], r),
                    pass_fds=(r, *shared.inherited(walls)),
                    env=env,
                    cwd=world.app,
                    capture_output=True,
                    timeout=50,
                    check=False,
                )

            done = await trio.to_thread.run_sync(run)
            os.close(r)
            shared.close()
            nursery.cancel_scope.cancel()
    assert done.returncode == 0, done.stderr.decode()
    result = json.loads(done.stdout.decode().strip().splitlines()[-1])
    assert result == {"allowed": len(PAGE), "other": 403, "direct": "ConnectionRefusedError"}
    assert len(seen) == 1
    # A refusal is recorded as it is answered, an allowed connection when it closes: either
    # may come first.
    assert sorted((a.allowed, a.port, a.sidecar) for a in audit) == [
        (False, other, "hostile"),
        (True, web, "hostile"),
    ]


async def test_tunnel_and_relay_count_every_byte_and_pass_half_closes_on() -> None:
    """The tunnel and the loopback relay move bytes in the kernel (``splice``): what each side
    sent arrives whole, a client's half-close reaches the server, and the audit record and the
    sidecar's stats count exactly what was delivered, each way."""
    up, down = os.urandom(300_000), os.urandom(1_000_000)
    got: list[bytes] = []

    async def sink_then_answer(stream: trio.SocketStream) -> None:
        buf = bytearray()
        async with stream:
            while data := await stream.receive_some(65536):  # until the client's EOF
                buf += data
            got.append(bytes(buf))
            await stream.send_all(down)

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            listener = (await trio.open_tcp_listeners(0, host="127.0.0.1"))[0]
            nursery.start_soon(trio.serve_listeners, sink_then_answer, [listener])
            server = listener.socket.getsockname()[1]
            proxy, audit = await start(nursery)
            tunnel, relay = socket.socket(), socket.socket()
            for sock in (tunnel, relay):
                sock.bind(("127.0.0.1", 0))
                sock.listen(8)
            client = client_for("s", [f"127.0.0.1:{server}"], worker="s#1")
            proxy.serve_listener(tunnel, client)
            proxy.serve_listener(relay, client, relay_to=server)
            for port, head in (
                (tunnel.getsockname()[1], b"CONNECT 127.0.0.1:%d HTTP/1.1\r\n\r\n" % server),
                (relay.getsockname()[1], b""),
            ):
                stream = await trio.open_tcp_stream("127.0.0.1", port)
                async with stream:
                    await stream.send_all(head + up)  # the bytes follow the head at once
                    await stream.send_eof()
                    out = bytearray()
                    while data := await stream.receive_some(65536):
                        out += data
                answer = b"HTTP/1.1 200 Connection established\r\n\r\n" if head else b""
                assert bytes(out) == answer + down
            await trio.testing.wait_all_tasks_blocked()
            nursery.cancel_scope.cancel()
    assert got == [up, up]
    assert [(r.method, r.allowed, r.bytes_out, r.bytes_in) for r in audit] == [
        ("CONNECT", True, len(up), len(down)),
        ("TCP", True, len(up), len(down)),
    ]
    stats = proxy.statistics()["s"]
    assert (stats.connections, stats.open) == (2, 0)
    assert (stats.bytes_out, stats.bytes_in) == (2 * len(up), 2 * len(down))


async def test_a_request_sent_with_a_refused_connect_reaches_nothing() -> None:
    """A client may send its request right after the ``CONNECT`` head (the web sidecar does,
    through the host's proxy): refused, the proxy answers ``403`` with the reason, drops the
    request, and the destination sees nothing."""
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            web, seen = await http_server(nursery)
            proxy, audit = await start(nursery)
            port = await proxy.open_shared()
            token = proxy.add_token(client_for("s", [f"127.0.0.1:{web + 1}"]))
            out = await request(
                port,
                b"CONNECT 127.0.0.1:%d HTTP/1.1\r\n%s\r\nGET / HTTP/1.1\r\nHost: x\r\n\r\n"
                % (web, auth(token)),
            )
            assert out.startswith(b"HTTP/1.1 403 Forbidden")
            assert b"matches no confine.network.allow rule" in out
            assert b"HTTP/1.1 200" not in out
            nursery.cancel_scope.cancel()
    assert seen == []
    assert [(r.allowed, r.rule, r.bytes_out) for r in audit] == [(False, "no-rule", 0)]


async def test_the_200_of_a_pipelined_connect_comes_even_when_the_server_sends_nothing() -> None:
    """With the request sent after the head, the proxy's ``200`` travels with the server's
    first bytes; a server that sends none still lets the client see the ``200``, then the end."""

    async def silent(stream: trio.SocketStream) -> None:
        async with stream:
            while await stream.receive_some(65536):
                pass

    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            listener = (await trio.open_tcp_listeners(0, host="127.0.0.1"))[0]
            nursery.start_soon(trio.serve_listeners, silent, [listener])
            server = listener.socket.getsockname()[1]
            proxy, audit = await start(nursery)
            port = await proxy.open_shared()
            token = proxy.add_token(client_for("s", [f"127.0.0.1:{server}"]))
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            async with stream:
                await stream.send_all(
                    b"CONNECT 127.0.0.1:%d HTTP/1.1\r\n%s\r\nhello" % (server, auth(token))
                )
                await stream.send_eof()
                out = b""
                while data := await stream.receive_some(65536):
                    out += data
            assert out == b"HTTP/1.1 200 Connection established\r\n\r\n"
            await trio.testing.wait_all_tasks_blocked()
            nursery.cancel_scope.cancel()
    assert [(r.allowed, r.bytes_out, r.bytes_in) for r in audit] == [(True, 5, 0)]


async def test_a_client_that_sends_nothing_gets_its_408_within_seconds() -> None:
    """The proxy's listeners wake on a connection's first bytes (``TCP_DEFER_ACCEPT``); one
    that never sends any is taken after about ``first_bytes_s`` and answered ``408``
    ``first_bytes_s`` later (default 1 s each; it waited ~25 s when the head timeout set both),
    with nothing audited."""
    assert EgressLimits().first_bytes_s <= 1.0
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            proxy, audit = await start(nursery)
            port = await proxy.open_shared()
            began = trio.current_time()
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            async with stream:
                assert (await stream.receive_some(100)).startswith(b"HTTP/1.1 408")
            waited = trio.current_time() - began
            nursery.cancel_scope.cancel()
    assert 1.0 <= waited < 5.0, waited
    assert audit == []


async def test_an_allowed_destination_that_cannot_be_reached_is_audited_as_not_made() -> None:
    """A ``502`` (the allowed address refuses) is no allowed connection: the audit line says
    ``allowed: false``, rule ``unreachable``, the reason; the sidecar's stats count it refused,
    not connected; the same for a loopback relay whose port has no listener."""
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    dead = closed.getsockname()[1]
    closed.close()  # nothing listens there now
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            proxy, audit = await start(nursery)
            port = await proxy.open_shared()
            token = proxy.add_token(client_for("u", [f"127.0.0.1:{dead}"]))
            out = await request(
                port, b"CONNECT 127.0.0.1:%d HTTP/1.1\r\n%s\r\nGET /" % (dead, auth(token))
            )
            assert out.startswith(b"HTTP/1.1 502 Bad Gateway"), out
            assert b"cannot be reached" in out
            relay = socket.socket()
            relay.bind(("127.0.0.1", 0))
            relay.listen(8)
            proxy.serve_listener(relay, client_for("u", []), relay_to=dead)
            stream = await trio.open_tcp_stream("127.0.0.1", relay.getsockname()[1])
            async with stream:
                assert await stream.receive_some(100) == b""  # closed: nothing to relay to
            nursery.cancel_scope.cancel()
    assert [(r.method, r.allowed, r.rule) for r in audit] == [
        ("CONNECT", False, "unreachable"),
        ("TCP", False, "unreachable"),
    ]
    assert all("cannot be reached" in r.reason for r in audit)
    stats = proxy.statistics()["u"]
    assert (stats.connections, stats.refused, stats.open) == (0, 2, 0)
