"""The egress proxy's fast path (``host.egress``): a proxied connection served whole in the relay
thread, with no trio involvement, when it needs nothing the trio side is for.

# Strategy: the relay thread (``host.egress_relay``) owns the proxy's listeners in its ``epoll``
# and calls :func:`attempt` for each connection it accepts. The usual connection (the web
# sidecar's) arrives whole: the listeners wake on its first bytes (``TCP_DEFER_ACCEPT``), so
# one read holds the ``CONNECT`` head and the pipelined request. :func:`attempt` parses it,
# authenticates a token (the shared port), applies the per-sidecar cap, decides an address
# literal's destination (``policy.egress.decide``, pure: no DNS), connects without waiting
# (a loopback handshake is over when ``connect`` returns) and sends what goes first: the
# connection is then an :class:`Opened` tunnel for the relay. Everything else is
# :class:`Handed` to the trio side with the bytes already read, where the proxy's one
# connection path (``EgressProxy._serve``) keeps every other case and its error semantics: a
# head not complete in the first read, a name to resolve, a refusal (``403``/``407``/``431``/
# ``503``), a connect still in progress or failed (``502``/``504``). Nothing here waits, and
# nothing touches trio: the relay thread runs it with its lock held.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import socket as stdsocket
import threading
from collections.abc import Mapping

import msgspec

from supervisor.contracts.confine import EgressRecord
from supervisor.host import egress_io
from supervisor.host.egress_http import (
    ESTABLISHED,
    Refusal,
    origin_request,
    parse_head,
    target_of,
)
from supervisor.policy.egress import Rule, decide, literal_address


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


class Request:
    """A parsed proxy request: who asks, for what, and the bytes sent after its head."""

    __slots__ = ("client", "headers", "host", "method", "port", "rest", "target")

    def __init__(
        self,
        client: Client,
        method: str,
        target: str,
        headers: list[tuple[bytes, bytes]],
        rest: bytes,
        host: str,
        port: int,
    ) -> None:
        self.client, self.method, self.target, self.headers = client, method, target, headers
        self.rest, self.host, self.port = rest, host, port

    def record(
        self, allowed: bool, rule: str, reason: str, counts: list[int] | None = None
    ) -> EgressRecord:
        """Its audit record."""
        return record_of(
            self.client, self.host, self.port, self.method, allowed, rule, reason, counts
        )


def record_of(
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


def authenticate(tokens: Mapping[str, Client], headers: list[tuple[bytes, bytes]]) -> Client:
    """The client whose token the request's ``Proxy-Authorization: Basic`` carries.

    Raises:
        Refusal: 407, no credentials or an unknown token.
    """
    value = next((v for k, v in headers if k == b"proxy-authorization"), b"")
    scheme, _, encoded = value.partition(b" ")
    token = ""
    if scheme.lower() == b"basic":
        try:
            _, _, token = base64.b64decode(encoded.strip(), validate=True).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError):
            token = ""
    found = None
    for known, client in tokens.items():  # constant time per candidate
        if hmac.compare_digest(known.encode(), token.encode()):
            found = client
    if found is None:
        raise Refusal(407, "proxy credentials missing or unknown: use the proxy URL in HTTP_PROXY")
    return found


class Live:
    """Connections open per sidecar (connected, until both sockets are closed), kept exact from
    both threads: the per-sidecar cap and ``EgressStats.open``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open: dict[str, int] = {}

    def count(self, sidecar: str) -> int:
        return self._open.get(sidecar, 0)

    def add(self, sidecar: str, n: int) -> None:
        with self._lock:
            left = self._open.get(sidecar, 0) + n
            if left:
                self._open[sidecar] = left
            else:
                self._open.pop(sidecar, None)

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._open)


class Opened:
    """A connection the fast path served: checked, connected, what goes first sent as far as
    the sockets took it (the rest: ``to_client``, not counted, and ``to_upstream``, counted when
    it goes); the relay carries it from here, ``answer`` (not counted) going to the client with
    the upstream's first bytes."""

    __slots__ = ("answer", "counts", "request", "rule", "to_client", "to_upstream", "upstream")

    def __init__(
        self,
        request: Request,
        rule: str,
        upstream: stdsocket.socket,
        counts: list[int],
        *,
        answer: bytes = b"",
        to_client: bytes = b"",
        to_upstream: bytes = b"",
    ) -> None:
        self.request, self.rule, self.upstream, self.counts = request, rule, upstream, counts
        self.answer, self.to_client, self.to_upstream = answer, to_client, to_upstream


class Handed:
    """A connection for the trio side: the bytes read so far (``prefix``) and, when the fast path
    got as far as the connect, the request, the rule that allowed it, the address, and the
    connect still in progress (``upstream``) or its failure (``refusal``)."""

    __slots__ = ("address", "prefix", "refusal", "request", "rule", "upstream")

    def __init__(
        self,
        prefix: bytes,
        request: Request | None = None,
        rule: str = "",
        address: str = "",
        *,
        upstream: stdsocket.socket | None = None,
        refusal: Refusal | None = None,
    ) -> None:
        self.prefix, self.request, self.rule, self.address = prefix, request, rule, address
        self.upstream, self.refusal = upstream, refusal


def attempt(
    conn: stdsocket.socket,
    client: Client | None,
    tokens: Mapping[str, Client],
    live: Live,
    limits: EgressLimits,
) -> Opened | Handed | None:
    """Serve ``conn`` (just accepted, non-blocking) as far as possible without waiting: an
    :class:`Opened` tunnel, a :class:`Handed` connection, or None when it ended (closed or
    reset before its first bytes: closed here, nothing to answer or audit).

    ``client`` is the listener's (None: the shared port, identified by a token in ``tokens``).
    Called in the relay thread; ``conn`` stays the caller's to close or pass on.
    """
    try:
        data = conn.recv(4096)
    except BlockingIOError:  # taken without bytes (TCP_DEFER_ACCEPT gave up): the 408 path
        return Handed(b"")
    except OSError:
        return None
    if not data:
        return None
    end = data.find(b"\r\n\r\n")
    if not 0 <= end <= limits.max_head:
        return Handed(data)
    try:
        method, target, headers = parse_head(data[:end])
        if client is None:
            client = authenticate(tokens, headers)
        host, port = target_of(method, target)
    except Refusal:
        return Handed(data)
    literal = literal_address(host)
    if literal is None or live.count(client.sidecar) >= limits.per_sidecar:
        return Handed(data)
    decision = decide(client.rules, host, port, [literal])
    if not decision.allowed:
        return Handed(data)
    request = Request(client, method, target, headers, data[end + 4 :], host, port)
    rule, address = decision.rule, decision.address
    try:
        upstream, done = egress_io.start_connect(address, port)
    except OSError as exc:
        return Handed(data, request, rule, address, refusal=unreachable(exc))
    if not done:  # not loopback: the trio side waits for it, with the connect timeout
        return Handed(data, request, rule, address, upstream=upstream)
    try:
        egress_io.connected(upstream)
    except OSError as exc:
        upstream.close()
        return Handed(data, request, rule, address, refusal=unreachable(exc))
    return opened(request, rule, conn, upstream)


def unreachable(exc: OSError) -> Refusal:
    """The ``502`` of a connect that failed."""
    return Refusal(502, f"cannot be reached: {exc}", "unreachable")


def opened(
    request: Request, rule: str, conn: stdsocket.socket, upstream: stdsocket.socket
) -> Opened:
    """The tunnel for ``request``, connected: what goes first sent now, as far as the socket
    takes it (a fresh connection takes a request head whole)."""
    counts = [0, 0]
    if request.method == "CONNECT" and not request.rest:  # the client waits for the 200
        return Opened(request, rule, upstream, counts, to_client=_send(conn, ESTABLISHED))
    answer = b""
    if request.method != "CONNECT":
        first = origin_request(
            request.method, request.target, request.host, request.port, request.headers
        )
        first += request.rest
    else:  # pipelined: the 200 goes out with the answer's first bytes
        answer, first = ESTABLISHED, request.rest
    left = _send(upstream, first)
    counts[1] += len(first) - len(left)
    return Opened(request, rule, upstream, counts, answer=answer, to_upstream=left)


def _send(sock: stdsocket.socket, data: bytes) -> bytes:
    """What of ``data`` ``sock`` did not take now (on an error: all of it; the relay meets the
    error at its first step and ends the tunnel)."""
    try:
        return data[sock.send(data) :]
    except OSError:
        return data
