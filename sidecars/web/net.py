"""HTTP for the web tools: httpx (HTTP/1.1 and HTTP/2), pooled per worker, SSRF-guarded.

# Strategy: the guard sits in httpcore's network backend, the one place every new connection
# passes through. ``connect_tcp`` resolves the host once, checks every resolved address against
# the policy, then connects to the checked address itself; TLS (SNI, certificate) and the Host
# header still use the name, so nothing resolves the name a second time (no DNS rebinding).
# Redirects are followed here, hop by hop (scheme check, loop detection, count), so each hop's
# connection goes through the same guard. Bodies are streamed to a sink in chunks and the read
# stops at the byte limit: a huge body is never held in memory. Confined with
# ``network.allow`` (PROTOCOL 7) the worker's only way out is the host's egress proxy, named by
# ``HTTPS_PROXY``/``HTTP_PROXY``: every connection is then a ``CONNECT host:port`` tunnel through
# it (TLS runs inside the tunnel), the proxy resolving the name and checking it against the
# sidecar's grants; this guard still checks whatever the name resolves to here (its own SSRF
# check stays as a second wall; inside the worker's namespace only ``/etc/hosts`` names and
# literal addresses resolve, the proxy judges the rest). When the proxy is the host's own
# (``TOOLHOST_EGRESS_PROXY`` names it) the ``CONNECT`` head goes out with the request's first
# bytes in one write and the proxy's answer is read with the response (:class:`_Tunnel`): one
# round trip to the proxy fewer per connection; a refusal still surfaces as ``EgressRefused``.
"""

from __future__ import annotations

import base64
import os
import socket
import ssl
import urllib.parse
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

import httpcore
import httpx
import msgspec
import trio

from sidecars.sdk import ToolError
from sidecars.web.policy import Limits, Policy

REDIRECTS = {301, 302, 303, 307, 308}
Sink = Callable[[bytes], Awaitable[None] | None]


class DestinationRefused(Exception):
    """The policy refused a resolved address (raised from the connection path)."""

    def __init__(self, host: str, address: str, category: str) -> None:
        super().__init__(f"{host} resolves to {address} ({category})")
        self.host, self.address, self.category = host, address, category


class EgressRefused(Exception):
    """The host's egress proxy refused a destination (``403`` and its one-line reason)."""

    def __init__(self, host: str, port: int, status: int, reason: str) -> None:
        super().__init__(reason or f"the egress proxy refused {host}:{port} ({status})")
        self.host, self.port, self.status, self.reason = host, port, status, reason


class Proxy(msgspec.Struct, frozen=True):
    """The egress proxy every connection is tunnelled through (``http://[user:pass@]h:p``)."""

    host: str
    port: int
    auth: str = ""
    """``Proxy-Authorization`` value (the token-identified shared proxy), empty when none."""
    early: bool = False
    """The host's own proxy: the request may follow the ``CONNECT`` head without waiting."""


HEAD_LIMIT = 16 << 10
READ_SIZE = 64 << 10
EGRESS_PROXY_VAR = "TOOLHOST_EGRESS_PROXY"
"""Set by the host to its egress proxy's URL (``supervisor.policy.egress.proxy_env``)."""


def proxy_from_env(env: Mapping[str, str] = os.environ) -> Proxy | None:
    """The proxy the worker's environment names (``HTTPS_PROXY``, then ``HTTP_PROXY``, either
    case), None when none or not an ``http://`` proxy URL."""
    for key in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy"):
        url = env.get(key, "")
        if not url:
            continue
        parts = urllib.parse.urlsplit(url)
        try:
            port = parts.port or 80
        except ValueError:
            return None
        if parts.scheme != "http" or not parts.hostname:
            return None
        auth = ""
        if parts.username is not None:
            user = urllib.parse.unquote(parts.username)
            pair = f"{user}:{urllib.parse.unquote(parts.password or '')}"
            auth = "Basic " + base64.b64encode(pair.encode()).decode("ascii")
        return Proxy(parts.hostname, port, auth, early=env.get(EGRESS_PROXY_VAR) == url)
    return None


class GuardedBackend(httpcore.AsyncNetworkBackend):
    """A Trio network backend that connects only to addresses the policy allows (through the
    egress proxy when ``proxy`` is set)."""

    def __init__(self, policy: Policy, proxy: Proxy | None = None) -> None:
        self.policy = policy
        self.proxy = proxy
        self.inner = httpcore.TrioBackend()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,  # noqa: ASYNC109 (httpcore's interface)
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        if self.proxy is not None:
            return await self._tunnel(self.proxy, host, port, timeout)
        try:
            infos = await trio.socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except OSError as exc:  # socket.gaierror: becomes httpx.ConnectError upstream
            raise httpcore.ConnectError(f"cannot resolve {host}: {exc}") from None
        addresses = list(dict.fromkeys(str(info[4][0]) for info in infos))
        if not addresses:
            raise httpcore.ConnectError(f"{host} did not resolve")
        refused = self.policy.refusal(host, addresses)
        if refused is not None:
            raise DestinationRefused(host, *refused)
        last: Exception | None = None
        for address in addresses:
            try:
                return await self.inner.connect_tcp(
                    address, port, timeout, local_address, socket_options
                )
            except (httpcore.ConnectError, httpcore.ConnectTimeout) as exc:
                last = exc
        assert last is not None
        raise last

    async def _tunnel(
        self,
        proxy: Proxy,
        host: str,
        port: int,
        timeout: float | None,  # noqa: ASYNC109 (httpcore's interface)
    ) -> httpcore.AsyncNetworkStream:
        """A ``CONNECT`` tunnel to ``host:port`` through ``proxy``, after this guard's check of
        what ``host`` resolves to here (a name that does not resolve here is the proxy's to
        judge)."""
        try:
            infos = await trio.socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except OSError:
            infos = []
        addresses = list(dict.fromkeys(str(info[4][0]) for info in infos))
        refused = self.policy.refusal(host, addresses) if addresses else None
        if refused is not None:
            raise DestinationRefused(host, *refused)
        target = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        head = f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n"
        if proxy.auth:
            head += f"Proxy-Authorization: {proxy.auth}\r\n"
        stream = await self.inner.connect_tcp(proxy.host, proxy.port, timeout)
        tunnel = _Tunnel(stream, (head + "\r\n").encode("ascii"), host, port)
        if proxy.early:
            return tunnel
        try:
            if await tunnel.open(timeout):
                raise httpcore.ProxyError("the egress proxy sent bytes before the tunnel")
        except BaseException:
            await stream.aclose()
            raise
        return stream

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,  # noqa: ASYNC109 (httpcore's interface)
        socket_options: Any = None,
    ) -> httpcore.AsyncNetworkStream:
        raise httpcore.ConnectError("unix sockets are not allowed")

    async def sleep(self, seconds: float) -> None:
        await self.inner.sleep(seconds)


class _Tunnel(httpcore.AsyncNetworkStream):
    """A connection to the proxy that sends the ``CONNECT`` head with its first write (the
    request's first bytes) and reads the proxy's answer before its first read returns, or
    before TLS starts: the request does not wait a round trip for the ``200``.

    Raises (from ``read``, ``start_tls`` and :meth:`open`):
        EgressRefused: The proxy refused (``403`` and the like, with its reason).
        httpcore.ConnectError: The proxy could not reach the destination (``502``;
            ``httpcore.ConnectTimeout`` for ``504``), as a direct connection would fail.
        httpcore.ProxyError: The proxy closed, or its answer was too long.
    """

    def __init__(
        self, stream: httpcore.AsyncNetworkStream, head: bytes, host: str, port: int
    ) -> None:
        self.stream, self.host, self.port = stream, host, port
        self._head = head
        self._answered = False

    async def open(self, timeout: float | None) -> bytes:  # noqa: ASYNC109
        """Send the head if it was not sent, read the answer; returns what came after it."""
        if self._head:
            head, self._head = self._head, b""
            await self.stream.write(head, timeout)
        answer = b""
        while b"\r\n\r\n" not in answer:
            # As much as a read of the response takes: the answer comes with its first bytes.
            chunk = await self.stream.read(READ_SIZE, timeout)
            if not chunk or len(answer) > HEAD_LIMIT:
                where = f"{self.host}:{self.port}"
                raise httpcore.ProxyError(f"the egress proxy closed the tunnel to {where}")
            answer += chunk
        head_bytes, _, body = answer.partition(b"\r\n\r\n")
        fields = head_bytes.split(b"\r\n", 1)[0].split(None, 2)
        status = int(fields[1]) if len(fields) > 1 and fields[1].isdigit() else 0
        if status == 200:
            self._answered = True
            return body
        while len(body) < 4096:
            chunk = await self.stream.read(4096, timeout)
            if not chunk:
                break
            body += chunk
        await self.stream.aclose()
        lines = body.decode("utf-8", "replace").strip().splitlines()
        reason = lines[0] if lines else ""
        if status in (502, 504):  # allowed, but the destination did not answer: as without it
            error = httpcore.ConnectTimeout if status == 504 else httpcore.ConnectError
            raise error(f"the egress proxy could not reach {self.host}:{self.port}: {reason}")
        raise EgressRefused(self.host, self.port, status, reason)

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:  # noqa: ASYNC109
        if not self._answered:
            early = await self.open(timeout)
            if early:
                return early
        return await self.stream.read(max_bytes, timeout)

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:  # noqa: ASYNC109
        if self._head:
            buffer, self._head = self._head + buffer, b""
        await self.stream.write(buffer, timeout)

    async def aclose(self) -> None:
        await self.stream.aclose()

    async def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,  # noqa: ASYNC109
    ) -> httpcore.AsyncNetworkStream:
        try:
            if await self.open(timeout):
                raise httpcore.ProxyError("the egress proxy sent bytes before the tunnel")
        except BaseException:
            await self.stream.aclose()
            raise
        return await self.stream.start_tls(ssl_context, server_hostname, timeout)

    def get_extra_info(self, info: str) -> Any:
        return self.stream.get_extra_info(info)


def refused_error(exc: DestinationRefused, url: str) -> ToolError:
    """The ``failed`` result for a refused destination: error code ``destination-refused``.

    The SDK keeps wire codes to PROTOCOL 3.1's five; this one refusal carries its own code, as
    the web family's contract asks (the envelope is ``failed`` with ``error.code``
    ``destination-refused``), and ``details.reason`` says the same.
    """
    error = ToolError(
        f"destination refused: {exc.host} resolves to {exc.address}, a {exc.category} address "
        "(config.allowPrivate or config.allowHosts opens it)",
        details={
            "url": url,
            "host": exc.host,
            "address": exc.address,
            "category": exc.category,
            "reason": "destination-refused",
        },
    )
    error.code = "destination-refused"
    return error


def egress_error(exc: EgressRefused, url: str) -> ToolError:
    """The ``failed`` result for a destination the host's egress proxy refused: code
    ``destination-refused``, the proxy's reason (it names the ``confine.network.allow`` rule
    that would open it)."""
    error = ToolError(
        f"destination refused by the host's egress proxy: {exc}",
        details={
            "url": url,
            "host": exc.host,
            "port": exc.port,
            "status": exc.status,
            "by": "egress-proxy",
            "reason": "destination-refused",
        },
    )
    error.code = "destination-refused"
    return error


def make_client(policy: Policy, proxy: Proxy | None = None) -> httpx.AsyncClient:
    """A pooled HTTP/1.1 + HTTP/2 client whose every connection passes the guard (and goes
    through ``proxy`` when set)."""
    transport = httpx.AsyncHTTPTransport(http2=True)
    transport._pool = httpcore.AsyncConnectionPool(
        ssl_context=httpx.create_ssl_context(),
        max_connections=32,
        max_keepalive_connections=16,
        keepalive_expiry=30.0,
        http1=True,
        http2=True,
        network_backend=GuardedBackend(policy, proxy),
    )
    return httpx.AsyncClient(transport=transport, follow_redirects=False, trust_env=False)


class Response:
    """What a streamed request left: final URL, status, headers and the redirect chain."""

    def __init__(self, url: str, status: int, headers: httpx.Headers, chain: list[str]) -> None:
        self.url, self.status, self.headers, self.redirects = url, status, headers, chain
        self.bytes = 0

    @property
    def content_type(self) -> str:
        return self.headers.get("content-type", "")


def check_url(url: str) -> httpx.URL:
    """Parse ``url``; only absolute http(s) URLs with a host pass.

    Raises:
        ToolError: ``invalid-input`` with reason ``bad-url`` or ``bad-scheme``.
    """
    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, ValueError) as exc:
        raise ToolError(
            f"bad URL {url!r}: {exc}",
            code="invalid-input",
            details={"url": url, "reason": "bad-url"},
        ) from None
    if parsed.scheme not in ("http", "https"):
        raise ToolError(
            f"only http and https URLs are fetched, not {parsed.scheme or 'a relative URL'!r}",
            code="invalid-input",
            details={"url": url, "reason": "bad-scheme"},
        )
    if not parsed.host:
        raise ToolError(
            f"URL {url!r} has no host",
            code="invalid-input",
            details={"url": url, "reason": "bad-url"},
        )
    return parsed


async def stream(
    client: httpx.AsyncClient,
    url: str,
    limits: Limits,
    max_bytes: int,
    sink: Sink,
    *,
    method: str = "GET",
    headers: dict[str, str] | None = None,
    json_body: Any = None,
    params: dict[str, str] | None = None,
) -> Response:
    """Request ``url`` following redirects, feeding the body to ``sink`` up to ``max_bytes``.

    The caller bounds the time (a Trio cancel scope); this function bounds redirects and bytes.

    Raises:
        ToolError: ``invalid-input`` for a bad URL or redirect scheme, ``failed`` with reason
            ``destination-refused``, ``redirect-loop``, ``too-many-redirects``, ``too-large``,
            ``connect-error`` or ``http-error``.
    """
    current = check_url(url)
    chain: list[str] = []
    seen = {str(current)}
    send_headers = {"User-Agent": limits.user_agent, **(headers or {})}
    while True:
        request = client.build_request(
            method, current, headers=send_headers, json=json_body, params=params
        )
        try:
            response = await client.send(request, stream=True)
        except DestinationRefused as exc:
            raise refused_error(exc, str(current)) from None
        except EgressRefused as exc:
            raise egress_error(exc, str(current)) from None
        except httpx.HTTPError as exc:
            raise ToolError(
                f"cannot fetch {current}: {type(exc).__name__}: {exc}",
                details={"url": str(current), "reason": "connect-error"},
            ) from None
        try:
            location = response.headers.get("location")
            if response.status_code in REDIRECTS and location:
                target = current.join(location)
                if target.scheme not in ("http", "https"):
                    raise ToolError(
                        f"redirect to a non-http(s) URL {str(target)!r} refused",
                        code="failed",
                        details={"url": str(target), "reason": "bad-scheme", "redirects": chain},
                    )
                chain.append(str(target))
                if str(target) in seen:
                    raise ToolError(
                        f"redirect loop: {target} was already visited",
                        details={"url": str(target), "reason": "redirect-loop", "redirects": chain},
                    )
                if len(chain) > limits.max_redirects:
                    raise ToolError(
                        f"more than {limits.max_redirects} redirects",
                        details={
                            "url": str(target),
                            "reason": "too-many-redirects",
                            "limit": limits.max_redirects,
                            "redirects": chain,
                        },
                    )
                seen.add(str(target))
                current, params = target, None  # the Location URL is complete as given
                if response.status_code == 303 or (
                    response.status_code in (301, 302) and method == "POST"
                ):
                    method, json_body = "GET", None
                continue
            result = Response(str(current), response.status_code, response.headers, chain)
            await _drain(response, result, max_bytes, sink)
            return result
        finally:
            await response.aclose()


async def _drain(response: httpx.Response, result: Response, max_bytes: int, sink: Sink) -> None:
    declared = response.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise ToolError(
            f"{result.url} declares {declared} bytes, over the limit of {max_bytes}",
            details={
                "url": result.url,
                "reason": "too-large",
                "limit": max_bytes,
                "declared": int(declared),
            },
        )
    try:
        async for chunk in response.aiter_bytes():
            result.bytes += len(chunk)
            if result.bytes > max_bytes:
                raise ToolError(
                    f"{result.url} sent more than {max_bytes} bytes; stopped reading",
                    details={"url": result.url, "reason": "too-large", "limit": max_bytes},
                )
            maybe = sink(chunk)
            if maybe is not None:
                await maybe
    except httpx.HTTPError as exc:
        raise ToolError(
            f"reading {result.url} failed: {type(exc).__name__}: {exc}",
            details={"url": result.url, "reason": "read-error", "bytes": result.bytes},
        ) from None
