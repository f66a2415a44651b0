"""The egress proxy's fast path (``host.egress_fast``) with real sockets and processes: the relay
thread accepts on the proxy's listeners and serves the usual connection whole (counted in
``served_fast``, audited, in the sidecar's stats); whatever needs the trio side (a refusal, a
name to resolve, a head split across writes, an unknown token, a connect still in progress) is
handed over with the bytes already read and answered as before; ``forget`` and the stop close
the listeners and cut the fast path's tunnels; many connections leave nothing behind."""

from __future__ import annotations

import base64
import logging
import os
import resource
import socket
import subprocess
import sys
import threading

import pytest
import trio

from supervisor.contracts.confine import EgressRecord
from supervisor.host import egress_relay
from supervisor.host.egress import EgressLimits, EgressProxy, client_for
from supervisor.policy.egress import IPAddress, literal_address
from tests.integration.test_egress_relay import hold, listen, open_tunnel, start

pytestmark = pytest.mark.skipif(
    not egress_relay.available() and os.environ.get("CI") != "true",
    reason="the relay thread needs Linux (epoll, splice, eventfd)",
)

PAGE = os.urandom(150_000)
ESTABLISHED = b"HTTP/1.1 200 Connection established\r\n\r\n"
ANSWER = b"HTTP/1.0 200 OK\r\n\r\n"


async def page_server(nursery: trio.Nursery) -> tuple[int, list[bytes]]:
    """A loopback server answering each request head with :data:`PAGE`; its port, and the
    request heads it got."""
    heads: list[bytes] = []

    async def answer(stream: trio.SocketStream) -> None:
        async with stream:
            buf = b""
            while b"\r\n\r\n" not in buf:
                data = await stream.receive_some(4096)
                if not data:
                    return
                buf += data
            heads.append(buf.split(b"\r\n\r\n")[0])
            await stream.send_all(ANSWER + PAGE)

    listener = (await trio.open_tcp_listeners(0, host="127.0.0.1"))[0]
    nursery.start_soon(trio.serve_listeners, answer, [listener])
    return int(listener.socket.getsockname()[1]), heads


def names(table: dict[str, str]):  # type: ignore[no-untyped-def]
    async def resolve(host: str, port: int) -> list[IPAddress]:
        found = literal_address(table.get(host, host))
        return [found] if found is not None else []

    return resolve


async def exchange(port: int, data: bytes) -> bytes:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(data)
        out = bytearray()
        while chunk := await stream.receive_some(65536):
            out += chunk
        return bytes(out)


async def until(check, what: str) -> None:  # type: ignore[no-untyped-def]
    """Until ``check()`` holds (the relay thread's counters and lines reach this thread within
    ``FLUSH_S``)."""
    with trio.fail_after(5):
        while not check():
            await trio.sleep(0.005)


def get(web: int) -> bytes:
    return b"CONNECT 127.0.0.1:%d HTTP/1.1\r\n\r\nGET / HTTP/1.0\r\n\r\n" % web


async def test_an_allowed_fetch_is_served_whole_in_the_relay_thread() -> None:
    """The common case never reaches the trio side: ``served_fast`` counts it, ``handed`` does
    not; the audit line and the stats count every byte, as on the trio path."""
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            web, heads = await page_server(nursery)
            proxy, audit, port = await start(nursery, [f"127.0.0.1:{web}"])
            assert await exchange(port, get(web)) == ESTABLISHED + ANSWER + PAGE
            # the absolute form too, rewritten for the origin
            out = await exchange(port, b"GET http://127.0.0.1:%d/a HTTP/1.1\r\n\r\n" % web)
            assert out == ANSWER + PAGE
            await until(lambda: len(audit) == 2, "two lines")
            stats = proxy.statistics()["s"]
            nursery.cancel_scope.cancel()
    assert (proxy.served_fast, proxy.handed) == (2, 0)
    assert heads[1].startswith(b"GET /a HTTP/1.1\r\nHost: 127.0.0.1:%d" % web)
    connect, plain = audit
    assert (connect.method, connect.allowed, connect.rule) == ("CONNECT", True, f"127.0.0.1:{web}")
    assert (connect.bytes_in, connect.bytes_out) == (len(ANSWER + PAGE), 18)
    assert (plain.method, plain.bytes_in, plain.worker) == ("GET", len(ANSWER + PAGE), "s#1")
    assert (stats.connections, stats.refused, stats.open) == (2, 0, 0)
    assert stats.bytes_in == 2 * len(ANSWER + PAGE)


async def test_a_refused_literal_destination_is_answered_by_the_trio_side_and_audited() -> None:
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            web, heads = await page_server(nursery)
            proxy, audit, port = await start(nursery, [f"127.0.0.1:{web}"])
            out = await exchange(port, get(web + 1))
            stats = proxy.statistics()["s"]
            nursery.cancel_scope.cancel()
    assert out.startswith(b"HTTP/1.1 403 Forbidden") and ESTABLISHED not in out
    assert b"matches no confine.network.allow rule" in out
    assert (proxy.served_fast, proxy.handed) == (0, 1)
    assert [(r.allowed, r.rule, r.port, r.bytes_out) for r in audit] == [
        (False, "no-rule", web + 1, 0)
    ]
    assert (stats.connections, stats.refused) == (0, 1)
    assert heads == []


async def test_a_name_is_resolved_on_the_trio_side() -> None:
    """A name needs DNS: handed over, resolved by the proxy's resolver, checked, connected (the
    address rule allows what the name resolves to)."""
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            web, _ = await page_server(nursery)
            resolver = names({"page.test": "127.0.0.1"})
            proxy, audit, port = await start(nursery, [f"127.0.0.1:{web}"], resolver=resolver)
            request = b"CONNECT page.test:%d HTTP/1.1\r\n\r\nGET / HTTP/1.0\r\n\r\n" % web
            assert await exchange(port, request) == ESTABLISHED + ANSWER + PAGE
            await until(lambda: len(audit) == 1, "the line")
            nursery.cancel_scope.cancel()
    assert (proxy.served_fast, proxy.handed) == (0, 1)
    assert [(r.host, r.allowed, r.rule) for r in audit] == [("page.test", True, f"127.0.0.1:{web}")]


async def test_a_head_split_across_two_writes_falls_back_and_works() -> None:
    """The first read has half the head: handed over with it, the trio side reads the rest."""
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            web, _ = await page_server(nursery)
            proxy, audit, port = await start(nursery, [f"127.0.0.1:{web}"])
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            async with stream:
                first, second = get(web)[:20], get(web)[20:]
                await stream.send_all(first)
                await until(lambda: proxy.handed == 1, "the hand-over")  # the relay read it
                await stream.send_all(second)
                out = bytearray()
                while chunk := await stream.receive_some(65536):
                    out += chunk
            await until(lambda: len(audit) == 1, "the line")
            nursery.cancel_scope.cancel()
    assert bytes(out) == ESTABLISHED + ANSWER + PAGE
    assert (proxy.served_fast, proxy.handed) == (0, 1)
    assert audit[0].allowed and audit[0].bytes_out == 18


def auth(token: str) -> bytes:
    return b"Proxy-Authorization: Basic " + base64.b64encode(f"toolhost:{token}".encode()) + b"\r\n"


async def test_the_shared_ports_token_is_checked_in_the_relay_thread() -> None:
    """A known token: served whole; a forged one: ``407`` from the trio side, nothing reached;
    a forgotten worker's token: ``407`` too."""
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            web, heads = await page_server(nursery)
            audit: list[EgressRecord] = []
            proxy = EgressProxy(audit=audit.append)
            await nursery.start(proxy.run)
            port = await proxy.open_shared()
            token = proxy.add_token(client_for("t", [f"127.0.0.1:{web}"], worker="t#1"))
            head = b"CONNECT 127.0.0.1:%d HTTP/1.1\r\n%s\r\nGET / HTTP/1.0\r\n\r\n"
            assert await exchange(port, head % (web, auth(token))) == ESTABLISHED + ANSWER + PAGE
            assert proxy.served_fast == 1
            forged = await exchange(port, head % (web, auth(token[:-1] + "x")))
            proxy.forget("t#1")
            dead = await exchange(port, head % (web, auth(token)))
            await until(lambda: len(audit) == 1, "the line")
            nursery.cancel_scope.cancel()
    for out in (forged, dead):
        assert out.startswith(b"HTTP/1.1 407") and b"Proxy-Authenticate: Basic" in out
    assert (proxy.served_fast, proxy.handed) == (1, 2)
    assert len(heads) == 1
    assert [(r.sidecar, r.worker, r.allowed) for r in audit] == [("t", "t#1", True)]


def full_listener() -> tuple[socket.socket, list[socket.socket]]:
    """A loopback listener whose accept queue is full (nothing accepts): the kernel drops a new
    connection's SYN, so a connect to it is in progress until it gives up; and the fillers."""
    full = socket.socket()
    full.bind(("127.0.0.1", 0))
    full.listen(0)
    fillers = []
    for _ in range(3):
        filler = socket.socket()
        filler.setblocking(False)
        filler.connect_ex(full.getsockname())
        fillers.append(filler)
    return full, fillers


async def test_a_connect_not_done_at_once_is_finished_on_the_trio_side() -> None:
    """An allowed address that does not answer at once (a loopback port whose accept queue is
    full drops the SYN) is the trio side's: it waits for the connect and answers ``504`` at the
    connect timeout, audited unreachable, counted refused."""
    limits = EgressLimits(connect_timeout_s=0.5)
    full, fillers = full_listener()
    dest = full.getsockname()[1]
    try:
        with trio.fail_after(20):
            async with trio.open_nursery() as nursery:
                proxy, audit, port = await start(nursery, [f"127.0.0.1:{dest}"], limits=limits)
                began = trio.current_time()
                out = await exchange(port, b"CONNECT 127.0.0.1:%d HTTP/1.1\r\n\r\nGET /" % dest)
                waited = trio.current_time() - began
                stats = proxy.statistics()["s"]
                nursery.cancel_scope.cancel()
    finally:
        for sock in (full, *fillers):
            sock.close()
    assert out.startswith(b"HTTP/1.1 504"), out
    assert 0.4 < waited < 5
    assert (proxy.served_fast, proxy.handed) == (0, 1)
    assert [(r.allowed, r.rule) for r in audit] == [(False, "unreachable")]
    assert "did not answer in 0.5 s" in audit[0].reason
    assert (stats.connections, stats.refused, stats.open) == (0, 1, 0)


async def read_all(stream: trio.SocketStream) -> bytes:
    out = bytearray()
    while data := await stream.receive_some(65536):
        out += data
    return bytes(out)


def refused(port: int) -> bool:
    """Whether a connection to ``port`` is refused now (its listener is closed)."""
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    except ConnectionRefusedError:
        return True
    return False


def relays() -> int:
    return sum(t.name == "toolhost-egress-relay" and t.is_alive() for t in threading.enumerate())


async def test_forget_and_the_stop_close_listeners_and_cut_fast_tunnels() -> None:
    """``forget`` closes the worker's listener at once (a connection is refused when it returns)
    and cuts its open tunnel (the end reaches the client, the line follows, ``open`` is back to
    0); the stop does the same for every other worker and ends the relay thread."""
    with trio.fail_after(20):
        async with trio.open_nursery() as outer:
            server = await serve(outer, hold)
            async with trio.open_nursery() as nursery:
                proxy, audit, port = await start(nursery, [f"127.0.0.1:{server}"])
                other = listen(proxy, [f"127.0.0.1:{server}"], "s#2")
                cut = await open_tunnel(port, server)
                kept = await open_tunnel(other, server)
                assert proxy.served_fast == 2 and proxy.statistics()["s"].open == 2
                proxy.forget("s#1")
                assert refused(port)
                assert await read_all(cut) == b""
                await cut.aclose()
                await until(lambda: len(audit) == 1, "the cut tunnel's line")
                assert proxy.statistics()["s"].open == 1
                assert not refused(other)
                nursery.cancel_scope.cancel()  # the host stops
            assert [(r.worker, r.bytes_out, r.bytes_in) for r in audit] == [
                ("s#1", 4, 5),
                ("s#2", 4, 5),
            ]
            assert refused(other) and relays() == 0
            with trio.fail_after(5):
                assert await read_all(kept) == b""
            await kept.aclose()
            outer.cancel_scope.cancel()


async def serve(nursery: trio.Nursery, handler) -> int:  # type: ignore[no-untyped-def]
    listener = (await trio.open_tcp_listeners(0, host="127.0.0.1"))[0]
    nursery.start_soon(trio.serve_listeners, handler, [listener])
    return int(listener.socket.getsockname()[1])


CLIENT = """
import os, socket, sys
port, web, n = (int(x) for x in sys.argv[1:4])
ok = 0
for i in range(n):
    target = web if i % 4 else web + 1  # one in four refused (the trio side)
    with socket.create_connection(("127.0.0.1", port)) as s:
        head = b"CONNECT 127.0.0.1:%d HTTP/1.1\\r\\n\\r\\nGET / HTTP/1.0\\r\\n\\r\\n" % target
        if i % 7 == 0:  # a split head (the trio side)
            s.sendall(head[:10]); s.recv(0); s.sendall(head[10:])
        else:
            s.sendall(head)
        got = b""
        while data := s.recv(65536):
            got += data
        ok += got.startswith(b"HTTP/1.1 200") and len(got) > 150000
print(ok)
"""


async def test_many_connections_from_another_process_leave_nothing_behind() -> None:
    """Hundreds of connections from a client process, served whole or handed over (refused,
    split heads): every one answered and audited, and after the stop this process has the
    descriptors and threads it had before (listener, epoll, eventfd, pipes included)."""
    n = 200
    with trio.fail_after(120):
        async with trio.open_nursery() as outer:
            web, _ = await page_server(outer)
            fds = set(os.listdir("/proc/self/fd"))
            async with trio.open_nursery() as nursery:
                proxy, audit, port = await start(nursery, [f"127.0.0.1:{web}"])

                def run() -> subprocess.CompletedProcess[str]:
                    argv = [sys.executable, "-c", CLIENT, str(port), str(web), str(n)]
                    return subprocess.run(argv, capture_output=True, text=True, timeout=100)

                done = await trio.to_thread.run_sync(run)
                await until(lambda: len(audit) == n, "every line")
                nursery.cancel_scope.cancel()
            left = set(os.listdir("/proc/self/fd")) - fds
            outer.cancel_scope.cancel()
    assert done.returncode == 0, done.stderr
    allowed = [r for r in audit if r.allowed]
    assert int(done.stdout) == len(allowed) == n - n // 4
    assert sum(not r.allowed and r.rule == "no-rule" for r in audit) == n // 4
    assert proxy.served_fast + proxy.handed == n and proxy.handed >= n // 4
    assert not left, f"descriptors left open: {left}"
    assert relays() == 0


async def test_a_listener_backs_off_while_out_of_descriptors_and_serves_after(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Out of descriptors (``EMFILE``), the relay's accept fails: the listener (level-triggered)
    pauses for ``ACCEPT_PAUSE_S`` instead of waking the relay in a loop, and the connection that
    waited is served once descriptors are back."""
    caplog.set_level(logging.WARNING, "toolhost.egress")
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            web, _ = await page_server(nursery)
            proxy, audit, port = await start(nursery, [f"127.0.0.1:{web}"])
            client = trio.socket.socket()  # made while there is room
            lowest = os.dup(2)  # the lowest free number: the next descriptor would get it
            os.close(lowest)
            soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
            resource.setrlimit(resource.RLIMIT_NOFILE, (lowest, hard))  # no number free
            try:
                await client.connect(("127.0.0.1", port))
                await client.send(get(web))
                failed = lambda: [r for r in caplog.records if "accept failed" in r.message]  # noqa: E731
                await until(lambda: failed(), "the failed accept")
                await trio.sleep(0.35)  # the window in which a busy loop would fail thousands
                fails = len(failed())
            finally:
                resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
            stream = trio.SocketStream(client)
            async with stream:
                out = await read_all(stream)
            await until(lambda: len(audit) == 1, "the line")
            nursery.cancel_scope.cancel()
    assert 1 <= fails <= 10, fails
    assert out == ESTABLISHED + ANSWER + PAGE
    assert proxy.served_fast == 1 and audit[0].allowed


async def test_the_cap_and_the_open_count_hold_across_both_threads() -> None:
    """Tunnels opened in the relay thread count toward the per-sidecar cap that the trio side
    answers (``503``, audited before the answer); ``open`` in the stats is exact while they are
    up and back to 0 once the relay closed them."""
    limits = EgressLimits(per_sidecar=8)
    with trio.fail_after(30):
        async with trio.open_nursery() as outer:
            server = await serve(outer, hold)
            async with trio.open_nursery() as nursery:
                proxy, audit, port = await start(nursery, [f"127.0.0.1:{server}"], limits=limits)
                tunnels = [await open_tunnel(port, server) for _ in range(8)]
                assert proxy.served_fast == 8 and proxy.statistics()["s"].open == 8
                over = await exchange(port, b"CONNECT 127.0.0.1:%d HTTP/1.1\r\n\r\n" % server)
                assert over.startswith(b"HTTP/1.1 503")
                assert b"has 8 egress connections open" in body(over)
                assert [r.rule for r in audit] == ["too-many-connections"]
                for stream in tunnels:
                    await stream.aclose()
                await until(lambda: len(audit) == 9, "every line")
                stats = proxy.statistics()["s"]
                again = await open_tunnel(port, server)  # room again
                await again.aclose()
                nursery.cancel_scope.cancel()
            outer.cancel_scope.cancel()
    assert (stats.connections, stats.refused, stats.open) == (8, 1, 0)
    assert proxy.served_fast == 9 and proxy.handed == 1


def body(answer: bytes) -> bytes:
    """The body of one of the proxy's own answers."""
    return answer.partition(b"\r\n\r\n")[2]
