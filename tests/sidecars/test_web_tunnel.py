"""The web sidecar's client through an egress proxy: through the host's own proxy it sends its
request with the ``CONNECT`` head (no round trip waiting for the ``200``), through another
proxy it waits; either way a page arrives whole and a refusal (plain or TLS) is the
``destination-refused`` failure naming the rule."""

from __future__ import annotations

import socket

import pytest
import trio

from sidecars.sdk import ToolError
from sidecars.web.net import Proxy, make_client, proxy_from_env, stream
from sidecars.web.policy import Limits, policy_from_config
from supervisor.host.egress import EgressProxy, client_for

pytest.importorskip("httpx")
POLICY = policy_from_config({"allowPrivate": True})
PAGE = b"p" * 200_000


async def fetch(proxy: Proxy, url: str) -> bytes:
    body = bytearray()
    async with make_client(POLICY, proxy) as client:
        await stream(client, url, Limits({}), 1 << 20, body.extend)
    return bytes(body)


async def test_the_request_follows_the_connect_head_only_for_the_hosts_proxy() -> None:
    """A stand-in proxy notes whether the request came with the head, then answers as the
    tunnel and the origin would."""
    with_head: list[bool] = []

    async def handle(conn: trio.SocketStream) -> None:
        async with conn:
            buf = b""
            while b"\r\n\r\n" not in buf:
                buf += await conn.receive_some(4096)
            head, _, rest = buf.partition(b"\r\n\r\n")
            assert head.startswith(b"CONNECT 127.0.0.1:9 HTTP/1.1")
            with_head.append(rest.startswith(b"GET /x HTTP/1.1"))
            await conn.send_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
            while b"\r\n\r\n" not in rest:
                rest += await conn.receive_some(4096)
            await conn.send_all(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello")

    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            listener = (await trio.open_tcp_listeners(0, host="127.0.0.1"))[0]
            nursery.start_soon(trio.serve_listeners, handle, [listener])
            port = listener.socket.getsockname()[1]
            for early in (True, False):
                assert await fetch(
                    Proxy("127.0.0.1", port, early=early), "http://127.0.0.1:9/x"
                ) == (b"hello")
            nursery.cancel_scope.cancel()
    assert with_head == [True, False]


def test_only_the_proxy_the_host_names_is_its_own() -> None:
    url = "http://127.0.0.1:3128"
    assert proxy_from_env({"HTTPS_PROXY": url, "TOOLHOST_EGRESS_PROXY": url}) == Proxy(
        "127.0.0.1", 3128, early=True
    )
    other = proxy_from_env({"HTTPS_PROXY": "http://corp:8080", "TOOLHOST_EGRESS_PROXY": url})
    assert other == Proxy("corp", 8080, early=False)
    assert proxy_from_env({"HTTP_PROXY": url}) == Proxy("127.0.0.1", 3128, early=False)


async def test_through_the_hosts_proxy_a_page_arrives_and_a_refusal_names_the_rule() -> None:
    async def page(conn: trio.SocketStream) -> None:
        async with conn:
            buf = b""
            while b"\r\n\r\n" not in buf:
                buf += await conn.receive_some(4096)
            head = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(PAGE)
            await conn.send_all(head + PAGE)

    audit: list[object] = []
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            listener = (await trio.open_tcp_listeners(0, host="127.0.0.1"))[0]
            nursery.start_soon(trio.serve_listeners, page, [listener])
            web = listener.socket.getsockname()[1]
            egress = EgressProxy(audit=audit.append)
            await nursery.start(egress.run)
            mine = socket.socket()
            mine.bind(("127.0.0.1", 0))
            mine.listen(8)
            proxy = Proxy("127.0.0.1", mine.getsockname()[1], early=True)
            egress.serve_listener(mine, client_for("web", [f"127.0.0.1:{web}"]))
            assert await fetch(proxy, f"http://127.0.0.1:{web}/page") == PAGE
            for url in (f"http://127.0.0.1:{web + 1}/", f"https://127.0.0.1:{web + 1}/"):
                with pytest.raises(ToolError) as refused:
                    await fetch(proxy, url)
                assert refused.value.code == "destination-refused"
                assert refused.value.details["by"] == "egress-proxy"
                assert "matches no confine.network.allow rule" in refused.value.message
            nursery.cancel_scope.cancel()
    stats = egress.statistics()["web"]
    assert (stats.connections, stats.refused) == (1, 2)
    assert stats.bytes_in > len(PAGE)


async def test_an_allowed_port_that_refuses_is_a_connect_error_not_a_refusal() -> None:
    """The host's proxy answers ``502`` when an allowed destination refuses: the web tools say
    ``connect-error``, as they do without the proxy, not ``destination-refused``."""
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    dead = closed.getsockname()[1]
    closed.close()
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            egress = EgressProxy()
            await nursery.start(egress.run)
            mine = socket.socket()
            mine.bind(("127.0.0.1", 0))
            mine.listen(8)
            egress.serve_listener(mine, client_for("web", [f"127.0.0.1:{dead}"]))
            proxy = Proxy("127.0.0.1", mine.getsockname()[1], early=True)
            with pytest.raises(ToolError) as failed:
                await fetch(proxy, f"http://127.0.0.1:{dead}/")
            nursery.cancel_scope.cancel()
    assert failed.value.details["reason"] == "connect-error"
    assert "could not reach" in failed.value.message and "cannot be reached" in failed.value.message
    assert egress.statistics()["web"].refused == 1
