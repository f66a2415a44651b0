"""The host's egress proxy (PROTOCOL 7): the only way out for a sidecar with
``confine.network.allow``, and the relay to its granted loopback ports.

# Strategy: one trio task tree, :meth:`EgressProxy.run`. How the proxy knows who connects:
# each sidecar with a network namespace of its own (``processes.netns.Holder``, shared by its
# workers) has its own listener, made *inside* that namespace and held by the host
# (:meth:`serve_listener`), so a connection on it can only come from that sidecar's processes:
# nothing else can reach its namespace, and the identity needs no secret. A worker without a
# namespace (a host that cannot make one) reaches one shared loopback listener
# (:meth:`open_shared`) and proves who it is with a per-worker token in the proxy URL's
# credentials (``Proxy-Authorization: Basic``), 32 random bytes only in that worker's
# environment (which Landlock's ptrace rule keeps other sidecars from reading in ``/proc``). A
# request is read (head bounded in size and time), the name resolved by the host, every address
# checked against the sidecar's rules after
# resolution (``policy.egress.decide``), and the allowed address connected by number, so what
# was checked is what is reached; a refusal is ``403`` with a one-line reason naming the rule.
# ``CONNECT`` tunnels bytes; an absolute-form request is forwarded with its ``Host`` set to the
# checked name and ``Connection: close``. Bytes a client sends after its ``CONNECT`` head, before
# the ``200`` (its request, pipelined to save a round trip), are forwarded once the tunnel is up
# and dropped when it is refused. The connection path runs on plain non-blocking sockets
# (:mod:`supervisor.host.egress_io`: no scheduler pass after each operation) and the tunnel's
# bytes move socket -> pipe -> socket with ``splice(2)``: they never enter Python; the counts
# are what ``splice`` reports delivered. Every connection, allowed or refused, ends in one
# audit record and counts in the sidecar's :class:`EgressStats`.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import logging
import math
import secrets
import socket as stdsocket
from collections.abc import Awaitable, Callable, Sequence

import msgspec
import trio

from supervisor.contracts.confine import EgressRecord, EgressStats
from supervisor.host import egress_io
from supervisor.policy.egress import (
    Decision,
    IPAddress,
    Rule,
    decide,
    literal_address,
    parse_rules,
    sanitize_host,
)

log = logging.getLogger("toolhost.egress")

Resolver = Callable[[str, int], Awaitable[list[IPAddress]]]
Audit = Callable[[EgressRecord], None]


class EgressLimits(msgspec.Struct, frozen=True, kw_only=True):
    """What a hostile client cannot exceed."""

    max_head: int = 16 * 1024
    first_bytes_s: float = 1.0
    """A connection that sends nothing for this long after it is taken is answered ``408``
    (the listeners take it at the first bytes, or about this long after it was made when none
    come: ``TCP_DEFER_ACCEPT``, whole seconds)."""
    head_timeout_s: float = 10.0
    """The whole request head must be in this long after the connection is taken."""
    resolve_timeout_s: float = 5.0
    connect_timeout_s: float = 10.0
    idle_timeout_s: float = 300.0
    """A tunnel with no byte either way for this long is closed (at most a tenth of it, and a
    second, later)."""
    per_sidecar: int = 64
    """Connections one sidecar may have open at once."""
    chunk: int = 64 * 1024


class Client(msgspec.Struct, kw_only=True):
    """Who a listener or token belongs to, and what it may reach."""

    sidecar: str
    worker: str = ""
    rules: list[Rule] = msgspec.field(default_factory=list)


class _Refusal(Exception):
    def __init__(self, status: int, reason: str, rule: str = "") -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason
        self.rule = rule


_REASONS = {
    200: b"Connection established",
    400: b"Bad Request",
    403: b"Forbidden",
    405: b"Method Not Allowed",
    407: b"Proxy Authentication Required",
    408: b"Request Timeout",
    431: b"Request Header Fields Too Large",
    502: b"Bad Gateway",
    503: b"Service Unavailable",
    504: b"Gateway Timeout",
}
ESTABLISHED = b"HTTP/1.1 200 Connection established\r\n\r\n"
LINGER_S = 1.0
LINGER_BYTES = 1 << 20
_HOP = {b"proxy-authorization", b"proxy-connection", b"connection", b"keep-alive", b"host"}


async def system_resolver(host: str, port: int) -> list[IPAddress]:
    """Every address ``host`` resolves to (TCP), in the resolver's order."""
    found = literal_address(host)
    if found is not None:
        return [found]
    infos = await trio.socket.getaddrinfo(host, port, type=stdsocket.SOCK_STREAM)
    out: list[IPAddress] = []
    for _family, _type, _proto, _name, sockaddr in infos:
        address = literal_address(str(sockaddr[0]).split("%", 1)[0])
        if address is not None and address not in out:
            out.append(address)
    return out


def client_for(sidecar: str, allow: Sequence[str], worker: str = "") -> Client:
    """A :class:`Client` from a plan's ``allow`` texts (rules that do not parse are left out:
    the registry check already reported them)."""
    rules, _ = parse_rules(allow)
    return Client(sidecar=sidecar, worker=worker, rules=rules)


def shared_listener(host: str = "127.0.0.1", port: int = 0) -> stdsocket.socket:
    """A listening loopback socket for :meth:`EgressProxy.serve_shared` (made before the proxy
    runs, so its port can be written into the walls of the workers that will reach it)."""
    sock = stdsocket.socket(stdsocket.AF_INET, stdsocket.SOCK_STREAM)
    try:
        sock.setsockopt(stdsocket.SOL_SOCKET, stdsocket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    return sock


class EgressProxy:
    """The host's egress proxy and loopback relays.

    Args:
        audit: Called once per connection, allowed or refused.
        resolver: Name resolution (the system's; tests pass their own).
        limits: Caps and timeouts against hostile clients.
    """

    def __init__(
        self,
        *,
        audit: Audit | None = None,
        resolver: Resolver = system_resolver,
        limits: EgressLimits | None = None,
    ) -> None:
        self.audit = audit
        self.resolver = resolver
        self.limits = limits or EgressLimits()
        self._nursery: trio.Nursery | None = None
        self._scopes: dict[str, list[trio.CancelScope]] = {}
        self._tokens: dict[str, Client] = {}
        self._stats: dict[str, EgressStats] = {}
        self.shared_port = 0

    # lifecycle ---------------------------------------------------------------------------

    async def run(
        self, *, task_status: trio.TaskStatus[EgressProxy] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Serve every listener handed in until cancelled."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started(self)
            await trio.sleep_forever()

    def _start(self, key: str, fn: Callable[..., Awaitable[None]], *args: object) -> None:
        if self._nursery is None:
            raise RuntimeError("the egress proxy is not running")
        scope = trio.CancelScope()
        self._scopes.setdefault(key, []).append(scope)

        async def guarded() -> None:
            with scope:
                await fn(*args)

        self._nursery.start_soon(guarded)

    def serve_listener(
        self, listener: stdsocket.socket, client: Client, *, relay_to: int = 0
    ) -> None:
        """Serve a listener in a sidecar's network namespace (``SidecarWalls.listeners``).

        Args:
            listener: The listening socket (the host owns it from now on).
            client: Whom it belongs to (``worker`` empty: the whole sidecar), with the rules.
            relay_to: 0 for the proxy; a port number to relay plain TCP to that port of the
                host's loopback (a ``confine.network.loopback`` grant).
        """
        _listening(listener)
        if not relay_to:  # a proxy client speaks first; a relayed protocol may not
            self._defer_accept(listener)
        self._start(client.worker or client.sidecar, self._accept_loop, listener, client, relay_to)

    def _defer_accept(self, listener: stdsocket.socket) -> None:
        """Wake the accept loop only once a connection's first bytes are in (its request head,
        with the pipelined request): one wake-up of the host per connection fewer. A client
        that sends nothing is accepted after about ``first_bytes_s`` (whole seconds, at least
        one) and answered ``408`` ``first_bytes_s`` later."""
        seconds = max(1, math.ceil(min(self.limits.first_bytes_s, self.limits.head_timeout_s)))
        try:
            listener.setsockopt(stdsocket.IPPROTO_TCP, stdsocket.TCP_DEFER_ACCEPT, seconds)
        except (OSError, AttributeError):  # not Linux: accept at once
            pass

    def add_token(self, client: Client) -> str:
        """A new token for a worker that reaches the shared listener (no namespace); its proxy
        URL is ``http://toolhost:<token>@127.0.0.1:<shared_port>``. Forget it with
        :meth:`forget`."""
        token = secrets.token_urlsafe(32)
        self._tokens[token] = client
        return token

    def proxy_url(self, token: str) -> str:
        return f"http://toolhost:{token}@127.0.0.1:{self.shared_port}"

    async def open_shared(self, host: str = "127.0.0.1", port: int = 0) -> int:
        """Listen on the shared loopback port (token-identified clients); returns the port."""
        await trio.lowlevel.checkpoint()
        return self.serve_shared(shared_listener(host, port))

    def serve_shared(self, listener: stdsocket.socket) -> int:
        """Serve ``listener`` (:func:`shared_listener`) as the shared port: workers without a
        network namespace of their own, each identified by its token; returns the port."""
        _listening(listener)
        self._defer_accept(listener)
        self.shared_port = listener.getsockname()[1]
        self._start("", self._accept_loop, listener, None, 0)
        return self.shared_port

    def forget(self, worker: str) -> None:
        """Stop serving ``worker`` (a ``Client.worker``, or the sidecar id for a listener
        served for a whole sidecar): its listeners close, its tunnels are cut, its tokens die."""
        for scope in self._scopes.pop(worker, []):
            scope.cancel()
        for token in [t for t, c in self._tokens.items() if (c.worker or c.sidecar) == worker]:
            del self._tokens[token]

    def statistics(self) -> dict[str, EgressStats]:
        """Per sidecar: connections, refusals, bytes in and out, open connections."""
        return {k: msgspec.structs.replace(v) for k, v in self._stats.items()}

    # connections -------------------------------------------------------------------------

    async def _accept_loop(
        self, sock: stdsocket.socket, client: Client | None, relay_to: int
    ) -> None:
        try:
            async with trio.open_nursery() as nursery:
                while True:
                    try:
                        conn, _ = sock.accept()
                    except BlockingIOError:
                        await trio.lowlevel.wait_readable(sock)
                        continue
                    except OSError as exc:  # EMFILE and friends: back off, keep serving
                        log.warning("egress: accept failed: %s", exc)
                        await trio.sleep(0.1)
                        continue
                    conn.setblocking(False)  # TCP_NODELAY: the listener's, inherited
                    if relay_to:
                        assert client is not None
                        nursery.start_soon(self._relay, conn, client, relay_to)
                    else:
                        nursery.start_soon(self._serve, conn, client)
        finally:
            egress_io.close(sock)

    def _stat(self, sidecar: str) -> EgressStats:
        stats = self._stats.get(sidecar)
        if stats is None:
            stats = self._stats[sidecar] = EgressStats()
        return stats

    def _record(self, record: EgressRecord) -> None:
        stats = self._stat(record.sidecar)
        if record.allowed:
            stats.connections += 1
        else:
            stats.refused += 1
        stats.bytes_in += record.bytes_in
        stats.bytes_out += record.bytes_out
        if self.audit is not None:
            try:
                self.audit(record)
            except Exception:  # an audit hook must never break the proxy
                log.exception("egress: audit hook failed")
        if not record.allowed:
            log.info("egress refused for %s: %s", record.sidecar, record.reason)

    async def _serve(self, stream: stdsocket.socket, client: Client | None) -> None:
        limits = self.limits
        with egress_io.Closing(stream):
            try:
                head, rest = await self._read_head(stream)
                method, target, headers = _parse_head(head)
                if client is None:
                    client = self._authenticate(headers)
                host, port = _target(method, target)
            except _Refusal as refusal:
                await _answer(stream, refusal.status, refusal.reason, auth=refusal.status == 407)
                return
            except trio.TooSlowError:
                await _answer(stream, 408, "the request head did not arrive in time")
                return
            except OSError:  # reset, or closed before the head ended
                return
            stats = self._stat(client.sidecar)
            if stats.open >= limits.per_sidecar:
                reason = f"sidecar {client.sidecar} has {stats.open} egress connections open"
                # Recorded before the answer: the call that fails on it must find it.
                self._record(
                    _record(client, host, port, method, False, "too-many-connections", reason)
                )
                await _answer(stream, 503, reason)
                return
            decision = await self._decide(client, host, port)
            if not decision.allowed:
                self._record(
                    _record(client, host, port, method, False, decision.rule, decision.reason)
                )
                await _answer(stream, 403, decision.reason)
                return
            try:
                upstream = await self._connect(decision.address, port)
            except _Refusal as refusal:  # allowed, but not reached: no connection was made
                reason = f"{host}:{port} ({decision.address}) {refusal.reason}"
                self._record(_record(client, host, port, method, False, refusal.rule, reason))
                await _answer(stream, refusal.status, reason)
                return
            stats.open += 1
            counts = [0, 0]
            try:
                with egress_io.Closing(upstream):
                    await self._forward(
                        stream, upstream, method, target, host, port, headers, rest, counts
                    )
            finally:
                stats.open -= 1
                self._record(_record(client, host, port, method, True, decision.rule, "", counts))

    async def _read_head(self, stream: stdsocket.socket) -> tuple[bytes, bytes]:
        """The request head (without the blank line) and what came after it: at once when the
        first read holds it all (the listener woke on it), else within ``first_bytes_s`` for
        the first byte and ``head_timeout_s`` for the whole head.

        Raises:
            _Refusal: 431, the head is over ``max_head``.
            trio.TooSlowError: It did not arrive in time.
            OSError: Reset, or closed before the head ended.
        """
        limits = self.limits
        try:
            buf = bytearray(stream.recv(4096))
            if not buf:
                raise ConnectionError("closed before the head ended")
        except BlockingIOError:
            buf = bytearray()
        end = buf.find(b"\r\n\r\n")
        if end >= 0:  # the usual case: no deadline to set up
            return bytes(buf[:end]), bytes(buf[end + 4 :])
        start = trio.current_time()
        first = min(limits.first_bytes_s, limits.head_timeout_s)
        with trio.CancelScope(deadline=start + (limits.head_timeout_s if buf else first)) as scope:
            while True:
                end = buf.find(b"\r\n\r\n")
                if end >= 0:
                    return bytes(buf[:end]), bytes(buf[end + 4 :])
                if len(buf) > limits.max_head:
                    raise _Refusal(431, f"the request head is over {limits.max_head} bytes")
                data = await egress_io.recv(stream, 4096)
                if not data:
                    raise ConnectionError("closed before the head ended")
                if not buf:
                    scope.deadline = start + limits.head_timeout_s
                buf += data
        raise trio.TooSlowError

    def _authenticate(self, headers: list[tuple[bytes, bytes]]) -> Client:
        value = next((v for k, v in headers if k == b"proxy-authorization"), b"")
        scheme, _, encoded = value.partition(b" ")
        token = ""
        if scheme.lower() == b"basic":
            try:
                _, _, token = (
                    base64.b64decode(encoded.strip(), validate=True).decode().partition(":")
                )
            except (binascii.Error, UnicodeDecodeError):
                token = ""
        found = None
        for known, client in self._tokens.items():  # constant time per candidate
            if hmac.compare_digest(known.encode(), token.encode()):
                found = client
        if found is None:
            raise _Refusal(
                407, "proxy credentials missing or unknown: use the proxy URL in HTTP_PROXY"
            )
        return found

    async def _decide(self, client: Client, host: str, port: int) -> Decision:
        literal = literal_address(host)
        if literal is not None:  # an address resolves to itself
            return decide(client.rules, host, port, [literal])
        try:
            with trio.fail_after(self.limits.resolve_timeout_s):
                addresses = await self.resolver(host, port)
        except (OSError, trio.TooSlowError, UnicodeError):
            addresses = []
        return decide(client.rules, host, port, addresses)

    async def _connect(self, address: str, port: int) -> stdsocket.socket:
        """A connection to the checked address.

        Raises:
            _Refusal: 502 (refused, unreachable) or 504 (no answer in ``connect_timeout_s``),
                rule ``unreachable``.
        """
        try:
            sock, done = egress_io.start_connect(address, port)
            if done:  # no deadline to set up (loopback, or refused at once)
                await egress_io.finish_connect(sock, done)
                return sock
            with trio.fail_after(self.limits.connect_timeout_s):
                await egress_io.finish_connect(sock, done)
            return sock
        except trio.TooSlowError:
            why = f"did not answer in {self.limits.connect_timeout_s:g} s"
            raise _Refusal(504, f"cannot be reached: {why}", "unreachable") from None
        except OSError as exc:
            raise _Refusal(502, f"cannot be reached: {exc}", "unreachable") from None

    async def _forward(
        self,
        stream: stdsocket.socket,
        upstream: stdsocket.socket,
        method: str,
        target: str,
        host: str,
        port: int,
        headers: list[tuple[bytes, bytes]],
        rest: bytes,
        counts: list[int],
    ) -> None:
        answer = b""
        try:
            if method == "CONNECT" and rest:
                # The client sent its request without waiting for the 200 (the web sidecar
                # does): the 200 goes out with the first bytes of the answer.
                answer = ESTABLISHED
                await egress_io.send_all(upstream, rest)
                counts[1] += len(rest)
            elif method == "CONNECT":
                await egress_io.send_all(stream, ESTABLISHED)
            else:
                out = _origin_request(method, target, host, port, headers) + rest
                await egress_io.send_all(upstream, out)
                counts[1] += len(out)
        except OSError:
            return
        await self._splice(stream, upstream, counts, answer)

    async def _relay(self, stream: stdsocket.socket, client: Client, port: int) -> None:
        rule = "confine.network.loopback"
        counts = [0, 0]
        with egress_io.Closing(stream):
            try:
                upstream = await self._connect("127.0.0.1", port)
            except _Refusal as refusal:
                why = f"127.0.0.1:{port} {refusal.reason}"
                self._record(_record(client, "127.0.0.1", port, "TCP", False, refusal.rule, why))
                return
            stats = self._stat(client.sidecar)
            stats.open += 1
            try:
                with egress_io.Closing(upstream):
                    await self._splice(stream, upstream, counts)
            finally:
                stats.open -= 1
                self._record(_record(client, "127.0.0.1", port, "TCP", True, rule, "", counts))

    async def _splice(
        self,
        client: stdsocket.socket,
        upstream: stdsocket.socket,
        counts: list[int],
        answer: bytes = b"",
    ) -> None:
        """Copy both ways until both sides are done (half-closes passed on) or nothing moved
        for ``idle_timeout_s``; ``answer`` (not counted) goes to the client before the first
        bytes from upstream."""
        chunk = self.limits.chunk
        # The deadline moves at most every `step` (moving it is trio bookkeeping): a tunnel
        # closes after `idle_timeout_s` without a byte, and within `step` after that.
        step = min(1.0, self.limits.idle_timeout_s / 10)
        idle = self.limits.idle_timeout_s + step
        scope: trio.CancelScope  # the nursery's (below): no scope of its own per tunnel

        def moved(slot: int, n: int) -> None:
            counts[slot] += n
            now = trio.current_time()
            if now + idle - scope.deadline > step:
                scope.deadline = now + idle

        async def copy(
            src: stdsocket.socket, dst: stdsocket.socket, slot: int, prefix: bytes = b""
        ) -> None:
            try:
                if not await egress_io.pump(src, dst, chunk, slot, moved, prefix):
                    while data := await egress_io.recv(src, chunk):  # no splice here
                        await egress_io.send_all(dst, prefix + data)
                        moved(slot, len(data))
                        prefix = b""
                    await egress_io.send_all(dst, prefix)
                dst.shutdown(stdsocket.SHUT_WR)
            except OSError:
                scope.cancel()

        async with trio.open_nursery() as nursery:
            scope = nursery.cancel_scope
            scope.deadline = trio.current_time() + idle
            nursery.start_soon(copy, client, upstream, 1)
            await copy(upstream, client, 0, answer)


def _listening(listener: stdsocket.socket) -> None:
    """Non-blocking, and ``TCP_NODELAY`` for every connection it takes (Linux copies it to an
    accepted socket: a tunnel's last short segment must not wait for an ACK)."""
    listener.setblocking(False)
    listener.setsockopt(stdsocket.IPPROTO_TCP, stdsocket.TCP_NODELAY, 1)


def _record(
    client: Client,
    host: str,
    port: int,
    method: str,
    allowed: bool,
    rule: str,
    reason: str,
    counts: list[int] | None = None,
) -> EgressRecord:
    return EgressRecord(
        sidecar=client.sidecar,
        worker=client.worker,
        host=host,
        port=port,
        method=method,
        allowed=allowed,
        rule=rule,
        reason=reason,
        bytes_in=counts[0] if counts else 0,
        bytes_out=counts[1] if counts else 0,
    )


def _parse_head(head: bytes) -> tuple[str, str, list[tuple[bytes, bytes]]]:
    lines = head.split(b"\r\n")
    parts = lines[0].split(b" ")
    if len(parts) != 3 or not parts[2].startswith(b"HTTP/1."):
        raise _Refusal(400, "not an HTTP/1 proxy request")
    try:
        method, target = parts[0].decode("ascii"), parts[1].decode("ascii")
    except UnicodeDecodeError:
        raise _Refusal(400, "the request line is not ASCII") from None
    headers: list[tuple[bytes, bytes]] = []
    for line in lines[1:]:
        name, sep, value = line.partition(b":")
        if not sep or not name or name != name.strip() or line[:1] in b" \t":
            raise _Refusal(400, "a malformed header line")
        headers.append((name.lower(), value.strip()))
    names = {k for k, _ in headers}
    if b"content-length" in names and b"transfer-encoding" in names:
        raise _Refusal(400, "both Content-Length and Transfer-Encoding")
    return method, target, headers


def _split_authority(authority: str, default_port: int) -> tuple[str, str]:
    """(host, port text) of ``host[:port]`` or ``[v6][:port]``."""
    if authority.startswith("["):
        end = authority.find("]")
        if end < 0:
            return "", ""
        after = authority[end + 1 :]
        if after and not after.startswith(":"):
            return "", ""
        return authority[1:end], after[1:] if after else str(default_port)
    host, sep, port_text = authority.partition(":")
    return host, port_text if sep else str(default_port)


def _target(method: str, target: str) -> tuple[str, int]:
    """(host, port) a request asks for."""
    if method == "CONNECT":
        host, port_text = _split_authority(target, 0)
    elif target.lower().startswith("http://"):
        authority = target[7:].split("/", 1)[0].split("?", 1)[0]
        if "@" in authority:
            raise _Refusal(400, "credentials in the URL are not forwarded")
        host, port_text = _split_authority(authority, 80)
    elif target.lower().startswith("https://"):
        raise _Refusal(400, "an https:// URL goes through CONNECT (set HTTPS_PROXY)")
    else:
        raise _Refusal(400, "a proxy request needs an absolute http:// URL or CONNECT host:port")
    name = sanitize_host(host) if host else None
    if name is None or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise _Refusal(400, f"not a destination: {target[:200]!r}")
    return name, int(port_text)


def _origin_request(
    method: str, target: str, host: str, port: int, headers: list[tuple[bytes, bytes]]
) -> bytes:
    rest = target[7:]
    slash = rest.find("/")
    path = rest[slash:] if slash >= 0 else "/"
    authority = host if port == 80 else f"{host}:{port}"
    if ":" in host:
        authority = f"[{host}]" if port == 80 else f"[{host}]:{port}"
    lines = [f"{method} {path} HTTP/1.1".encode(), b"Host: " + authority.encode()]
    lines += [k + b": " + v for k, v in headers if k not in _HOP]
    lines.append(b"Connection: close")
    return b"\r\n".join(lines) + b"\r\n\r\n"


async def _answer(
    stream: stdsocket.socket, status: int, reason: str, *, auth: bool = False
) -> None:
    body = reason.replace("\r", " ").replace("\n", " ").encode() + b"\n"
    head = [
        b"HTTP/1.1 %d %s" % (status, _REASONS.get(status, b"Error")),
        b"Content-Type: text/plain; charset=utf-8",
        b"Content-Length: %d" % len(body),
        b"Connection: close",
    ]
    if auth:
        head.append(b'Proxy-Authenticate: Basic realm="toolhost"')
    try:
        await egress_io.send_all(stream, b"\r\n".join(head) + b"\r\n\r\n" + body)
        # Read (and drop) what the client still sends for a moment, so closing with unread
        # bytes does not reset the connection before the client reads the answer.
        stream.shutdown(stdsocket.SHUT_WR)
        with trio.move_on_after(LINGER_S):
            dropped = 0
            while dropped < LINGER_BYTES and (data := await egress_io.recv(stream, 65536)):
                dropped += len(data)
    except OSError:
        pass
