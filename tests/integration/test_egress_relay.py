"""The egress proxy's relay thread (``host.egress_relay``) with real sockets: a tunnel's bytes
move off the trio loop, every byte counted and one audit line per connection; a refusal is
audited; the host's stop and ``forget`` cut open tunnels; idle tunnels are closed; a slow reader
is not flooded; many tunnels leave no descriptor or thread behind."""

from __future__ import annotations

import os
import socket
import threading

import pytest
import trio

from supervisor.contracts.confine import EgressRecord
from supervisor.host import egress_relay
from supervisor.host.egress import EgressLimits, EgressProxy, client_for

pytestmark = pytest.mark.skipif(
    not egress_relay.available() and os.environ.get("CI") != "true",
    reason="the relay thread needs Linux (epoll, splice, eventfd)",
)


async def serve(nursery: trio.Nursery, handler) -> int:  # type: ignore[no-untyped-def]
    """A loopback TCP server running ``handler(stream)`` per connection; its port."""
    listener = (await trio.open_tcp_listeners(0, host="127.0.0.1"))[0]
    nursery.start_soon(trio.serve_listeners, handler, [listener])
    return int(listener.socket.getsockname()[1])


async def start(
    nursery: trio.Nursery, allow: list[str], worker: str = "s#1", **kw: object
) -> tuple[EgressProxy, list[EgressRecord], int]:
    """A running proxy, its audit list, and the port of a listener served for ``worker``."""
    audit: list[EgressRecord] = []
    proxy = EgressProxy(audit=audit.append, **kw)  # type: ignore[arg-type]
    await nursery.start(proxy.run)
    return proxy, audit, listen(proxy, allow, worker)


def listen(proxy: EgressProxy, allow: list[str], worker: str) -> int:
    """A loopback listener served for ``worker`` with the rules ``allow``; its port."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    proxy.serve_listener(listener, client_for("s", allow, worker=worker))
    return int(listener.getsockname()[1])


async def read_all(stream: trio.SocketStream) -> bytes:
    out = bytearray()
    while data := await stream.receive_some(65536):
        out += data
    return bytes(out)


async def wait_audit(audit: list[EgressRecord], n: int) -> None:
    """Until ``n`` records are in (the relay's finished tunnels reach the trio loop within
    ``FLUSH_S``)."""
    with trio.fail_after(5):
        while len(audit) < n:
            await trio.sleep(0.01)


def open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


def relays() -> int:
    """Relay threads alive in this process (other threads come and go: trio's own cache)."""
    return sum(t.name == "toolhost-egress-relay" and t.is_alive() for t in threading.enumerate())


async def test_a_fetch_goes_through_the_relay_thread_and_a_refusal_is_audited() -> None:
    page = os.urandom(200_000)

    async def answer(stream: trio.SocketStream) -> None:
        async with stream:
            buf = b""
            while b"\r\n\r\n" not in buf:
                buf += await stream.receive_some(4096)
            await stream.send_all(b"HTTP/1.0 200 OK\r\n\r\n" + page)

    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            web = await serve(nursery, answer)
            proxy, audit, port = await start(nursery, [f"127.0.0.1:{web}"])
            assert proxy.relay_thread_id, "the relay thread is running"
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            async with stream:
                await stream.send_all(
                    b"CONNECT 127.0.0.1:%d HTTP/1.1\r\n\r\nGET / HTTP/1.0\r\n\r\n" % web
                )
                out = await read_all(stream)
            head = b"HTTP/1.1 200 Connection established\r\n\r\nHTTP/1.0 200 OK\r\n\r\n"
            assert out == head + page
            refused = await trio.open_tcp_stream("127.0.0.1", port)
            async with refused:
                await refused.send_all(b"CONNECT 127.0.0.1:%d HTTP/1.1\r\n\r\n" % (web + 1))
                assert (await read_all(refused)).startswith(b"HTTP/1.1 403 Forbidden")
            await wait_audit(audit, 2)
            stats = proxy.statistics()["s"]
            nursery.cancel_scope.cancel()
    allowed, no = sorted(audit, key=lambda r: not r.allowed)
    assert (allowed.allowed, allowed.bytes_in, allowed.bytes_out) == (True, len(page) + 19, 18)
    assert (no.allowed, no.rule, no.bytes_in) == (False, "no-rule", 0)
    assert (stats.connections, stats.refused, stats.open) == (1, 1, 0)
    assert stats.bytes_in == len(page) + 19


async def hold(stream: trio.SocketStream) -> None:
    """A server that sends a greeting and then holds the connection until the peer ends it."""
    async with stream:
        await stream.send_all(b"hello")
        while await stream.receive_some(4096):
            pass


async def open_tunnel(port: int, server: int) -> trio.SocketStream:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    await stream.send_all(b"CONNECT 127.0.0.1:%d HTTP/1.1\r\n\r\nping" % server)
    got = b""
    while not got.endswith(b"hello"):
        got += await stream.receive_some(4096)
    return stream


async def test_the_hosts_stop_and_forget_cut_open_tunnels_each_audited() -> None:
    """Open tunnels in the relay thread end when the host stops serving their worker
    (``forget``: the client sees the end, the audit line follows) and when the proxy stops
    (the line is in when ``run`` returns); the relay thread is gone after the stop."""
    assert relays() == 0
    with trio.fail_after(20):
        async with trio.open_nursery() as outer:
            server = await serve(outer, hold)
            async with trio.open_nursery() as nursery:
                proxy, audit, port = await start(nursery, [f"127.0.0.1:{server}"])
                assert relays() == 1
                cut = await open_tunnel(port, server)
                proxy.forget("s#1")
                with trio.fail_after(5):
                    assert await read_all(cut) == b""  # the relay ended it
                await cut.aclose()
                await wait_audit(audit, 1)
                assert (audit[0].bytes_out, audit[0].bytes_in) == (4, 5)  # the 200 is not counted
                other = listener_for(proxy, server, "s#2")
                kept = await open_tunnel(other, server)
                nursery.cancel_scope.cancel()  # the host stops
            assert len(audit) == 2, "the stop flushed the cut tunnel's line"
            assert (audit[1].worker, audit[1].bytes_out) == ("s#2", 4)
            with trio.fail_after(5):
                assert await read_all(kept) == b""
            await kept.aclose()
            outer.cancel_scope.cancel()
    assert relays() == 0


ESTABLISHED = b"HTTP/1.1 200 Connection established\r\n\r\n"


def listener_for(proxy: EgressProxy, server: int, worker: str) -> int:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    proxy.serve_listener(listener, client_for("s", [f"127.0.0.1:{server}"], worker=worker))
    return int(listener.getsockname()[1])


async def test_an_idle_tunnel_is_closed_and_audited_without_another_connection() -> None:
    limits = EgressLimits(idle_timeout_s=0.5)
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            server = await serve(nursery, hold)
            proxy, audit, port = await start(nursery, [f"127.0.0.1:{server}"], limits=limits)
            stream = await open_tunnel(port, server)
            start_at = trio.current_time()
            with trio.fail_after(5):
                assert await read_all(stream) == b""
            waited = trio.current_time() - start_at
            await stream.aclose()
            await wait_audit(audit, 1)  # no other connection, no statistics() call
            assert proxy.statistics()["s"].open == 0
            nursery.cancel_scope.cancel()
    assert 0.4 < waited < 2.5
    assert audit[0].allowed and audit[0].bytes_in == 5


async def test_a_slow_reader_gets_every_byte_once_it_reads() -> None:
    """A client that reads nothing for a while, with a small receive buffer: the relay stops at
    its full socket and, the server having sent everything and gone quiet (no more events on
    its side), resumes only because it watches the client's socket for writing; every byte
    arrives, in order."""
    big = os.urandom(4 << 20)
    done = trio.Event()

    async def send_then_wait(stream: trio.SocketStream) -> None:
        async with stream:
            await stream.receive_some(4096)
            await stream.send_all(big)
            await done.wait()

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            server = await serve(nursery, send_then_wait)
            _, audit, port = await start(nursery, [f"127.0.0.1:{server}"])
            sock = trio.socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            await sock.connect(("127.0.0.1", port))
            stream = trio.SocketStream(sock)
            async with stream:
                await stream.send_all(b"CONNECT 127.0.0.1:%d HTTP/1.1\r\n\r\ngo" % server)
                await trio.sleep(0.5)  # not reading: the relay meets a full socket
                out = bytearray()
                with trio.fail_after(10):
                    while len(out) < len(ESTABLISHED) + len(big):
                        out += await stream.receive_some(65536)
                done.set()
            await wait_audit(audit, 1)
            nursery.cancel_scope.cancel()
    assert out == ESTABLISHED + big
    assert audit[0].bytes_in == len(big)


@pytest.mark.parametrize("relay", [True, False])
async def test_many_tunnels_leave_no_descriptor_or_thread_behind(relay: bool) -> None:
    """Hundreds of tunnels, sequential and concurrent, some cut by the server, some by the
    client's reset: after the proxy stops, this process has the descriptors and threads it
    had before (the relay's pipes, epoll and eventfd included)."""

    async def echo_then_close(stream: trio.SocketStream) -> None:
        async with stream:
            data = await stream.receive_some(4096)
            if data:
                await stream.send_all(data * 100)

    fds: set[str] = set()
    with trio.fail_after(60):
        async with trio.open_nursery() as outer:
            server = await serve(outer, echo_then_close)
            fds = open_fds()
            async with trio.open_nursery() as nursery:
                proxy, audit, port = await start(nursery, [f"127.0.0.1:{server}"], relay=relay)
                assert bool(proxy.relay_thread_id) == relay

                async def one(i: int) -> None:
                    stream = await trio.open_tcp_stream("127.0.0.1", port)
                    await stream.send_all(b"CONNECT 127.0.0.1:%d HTTP/1.1\r\n\r\nx" % server)
                    if i % 5 == 0:  # a reset half-way
                        stream.socket.setsockopt(
                            socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00"
                        )
                        await stream.aclose()
                        return
                    async with stream:
                        assert await read_all(stream) == ESTABLISHED + b"x" * 100

                for i in range(100):
                    await one(i)
                for _ in range(5):
                    async with trio.open_nursery() as batch:
                        for i in range(1, 21):
                            batch.start_soon(one, i)
                await wait_audit(audit, 200)
                nursery.cancel_scope.cancel()
            outer.cancel_scope.cancel()
    left = open_fds() - fds
    assert len(audit) == 200 and all(r.allowed for r in audit)
    assert not left, f"descriptors left open: {left}"
    assert relays() == 0
