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
# and dropped when it is refused (the head's parsing and the proxy's answers:
# :mod:`supervisor.host.egress_http`). The connection path runs on plain non-blocking sockets
# (:mod:`supervisor.host.egress_io`: no scheduler pass after each operation); a checked,
# connected tunnel then belongs to the relay thread (:mod:`supervisor.host.egress_relay`: its
# own ``epoll``, no trio task per tunnel), which moves the bytes socket -> pipe -> socket with
# ``splice(2)``: they never enter Python; the counts are what ``splice`` reports delivered.
# Every connection, allowed or refused, ends in one audit record and counts in the sidecar's
# :class:`EgressStats` (a tunnel's when the trio loop next takes what the relay finished:
# at the next connection, ``statistics()``, or ``egress_relay.FLUSH_S`` after it ended).
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
from supervisor.host import egress_io, egress_relay
from supervisor.host.egress_http import (
    ESTABLISHED,
    Refusal,
    origin_request,
    parse_head,
    reply,
    target_of,
)
from supervisor.policy.egress import (
    Decision,
    IPAddress,
    Rule,
    decide,
    literal_address,
    parse_rules,
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
        relay: Move tunnels' bytes in a relay thread (where the platform has one); False: in
            trio tasks, as before it (benchmarks and tests compare the two).
    """

    def __init__(
        self,
        *,
        audit: Audit | None = None,
        resolver: Resolver = system_resolver,
        limits: EgressLimits | None = None,
        relay: bool = True,
    ) -> None:
        self.audit = audit
        self.relay = relay
        self.resolver = resolver
        self.limits = limits or EgressLimits()
        self._nursery: trio.Nursery | None = None
        self._scopes: dict[str, list[trio.CancelScope]] = {}
        self._tokens: dict[str, Client] = {}
        self._stats: dict[str, EgressStats] = {}
        self.shared_port = 0
        self._relay_thread: egress_relay.Relay | None = None

    # lifecycle ---------------------------------------------------------------------------

    async def run(
        self, *, task_status: trio.TaskStatus[EgressProxy] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Serve every listener handed in until cancelled (tunnels move their bytes in a relay
        thread, started here and stopped when this returns)."""
        relay = None
        if self.relay and egress_relay.available():
            limits = self.limits
            relay = egress_relay.Relay(chunk=limits.chunk, idle_timeout_s=limits.idle_timeout_s)
            relay.start()
        self._relay_thread = relay
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                task_status.started(self)
                await trio.sleep_forever()
        finally:
            self._nursery = None
            self._relay_thread = None
            if relay is not None:
                relay.stop()

    @property
    def relay_thread_id(self) -> int:
        """The relay thread's id in the kernel (0: none), for benchmarks of its CPU."""
        return self._relay_thread.native_id if self._relay_thread is not None else 0

    def _start(self, key: str, listener: stdsocket.socket, client: Client | None, to: int) -> None:
        if self._nursery is None:
            raise RuntimeError("the egress proxy is not running")
        scope = trio.CancelScope()
        self._scopes.setdefault(key, []).append(scope)

        async def guarded() -> None:
            with scope:
                await self._accept_loop(listener, client, to, key)

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
        self._start(client.worker or client.sidecar, listener, client, relay_to)

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
        self._start("", listener, None, 0)
        return self.shared_port

    def forget(self, worker: str) -> None:
        """Stop serving ``worker`` (a ``Client.worker``, or the sidecar id for a listener
        served for a whole sidecar): its listeners close, its tunnels are cut, its tokens die."""
        for scope in self._scopes.pop(worker, []):
            scope.cancel()
        if self._relay_thread is not None:
            self._relay_thread.cut(worker)
        for token in [t for t, c in self._tokens.items() if (c.worker or c.sidecar) == worker]:
            del self._tokens[token]

    def statistics(self) -> dict[str, EgressStats]:
        """Per sidecar: connections, refusals, bytes in and out, open connections."""
        if self._relay_thread is not None:
            self._relay_thread.flush()  # the tunnels it ended since the trio loop last looked
        return {k: msgspec.structs.replace(v) for k, v in self._stats.items()}

    # connections -------------------------------------------------------------------------

    async def _accept_loop(
        self, sock: stdsocket.socket, client: Client | None, relay_to: int, key: str
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
                        nursery.start_soon(self._relay, conn, client, relay_to, key)
                    else:
                        nursery.start_soon(self._serve, conn, client, key)
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

    async def _serve(self, stream: stdsocket.socket, client: Client | None, key: str) -> None:
        limits = self.limits
        with egress_io.Closing(stream):
            try:
                head, rest = await self._read_head(stream)
                method, target, headers = parse_head(head)
                if client is None:
                    client = self._authenticate(headers)
                host, port = target_of(method, target)
            except Refusal as refusal:
                await reply(stream, refusal.status, refusal.reason, auth=refusal.status == 407)
                return
            except trio.TooSlowError:
                await reply(stream, 408, "the request head did not arrive in time")
                return
            except OSError:  # reset, or closed before the head ended
                return
            if self._relay_thread is not None:
                self._relay_thread.flush()  # the tunnels it ended count no more
            stats = self._stat(client.sidecar)
            if stats.open >= limits.per_sidecar:
                reason = f"sidecar {client.sidecar} has {stats.open} egress connections open"
                # Recorded before the answer: the call that fails on it must find it.
                self._record(
                    _record(client, host, port, method, False, "too-many-connections", reason)
                )
                await reply(stream, 503, reason)
                return
            decision = await self._decide(client, host, port)
            if not decision.allowed:
                self._record(
                    _record(client, host, port, method, False, decision.rule, decision.reason)
                )
                await reply(stream, 403, decision.reason)
                return
            try:
                upstream = await self._connect(decision.address, port)
            except Refusal as refusal:  # allowed, but not reached: no connection was made
                reason = f"{host}:{port} ({decision.address}) {refusal.reason}"
                self._record(_record(client, host, port, method, False, refusal.rule, reason))
                await reply(stream, refusal.status, reason)
                return
            stats.open += 1
            counts = [0, 0]
            rule = decision.rule

            def finish() -> None:
                stats.open -= 1
                self._record(_record(client, host, port, method, True, rule, "", counts))

            handed = False  # to the relay thread, with both sockets and `finish`
            try:
                with egress_io.Closing(upstream):
                    handed = await self._forward(
                        stream,
                        upstream,
                        method,
                        target,
                        host,
                        port,
                        headers,
                        rest,
                        counts,
                        key,
                        finish,
                    )
            finally:
                if not handed:
                    finish()

    async def _read_head(self, stream: stdsocket.socket) -> tuple[bytes, bytes]:
        """The request head (without the blank line) and what came after it: at once when the
        first read holds it all (the listener woke on it), else within ``first_bytes_s`` for
        the first byte and ``head_timeout_s`` for the whole head.

        Raises:
            Refusal: 431, the head is over ``max_head``.
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
                    raise Refusal(431, f"the request head is over {limits.max_head} bytes")
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
            raise Refusal(
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
            Refusal: 502 (refused, unreachable) or 504 (no answer in ``connect_timeout_s``),
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
            raise Refusal(504, f"cannot be reached: {why}", "unreachable") from None
        except OSError as exc:
            raise Refusal(502, f"cannot be reached: {exc}", "unreachable") from None

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
        key: str,
        finish: Callable[[], None],
    ) -> bool:
        """Send what goes first, then carry the tunnel; True when the relay thread took it."""
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
                out = origin_request(method, target, host, port, headers) + rest
                await egress_io.send_all(upstream, out)
                counts[1] += len(out)
        except OSError:
            return False
        return await self._carry(stream, upstream, counts, answer, key, finish)

    async def _relay(self, stream: stdsocket.socket, client: Client, port: int, key: str) -> None:
        rule = "confine.network.loopback"
        counts = [0, 0]
        if self._relay_thread is not None:
            self._relay_thread.flush()
        with egress_io.Closing(stream):
            try:
                upstream = await self._connect("127.0.0.1", port)
            except Refusal as refusal:
                why = f"127.0.0.1:{port} {refusal.reason}"
                self._record(_record(client, "127.0.0.1", port, "TCP", False, refusal.rule, why))
                return
            stats = self._stat(client.sidecar)
            stats.open += 1

            def finish() -> None:
                stats.open -= 1
                self._record(_record(client, "127.0.0.1", port, "TCP", True, rule, "", counts))

            handed = False
            try:
                with egress_io.Closing(upstream):
                    handed = await self._carry(stream, upstream, counts, b"", key, finish)
            finally:
                if not handed:
                    finish()

    async def _carry(
        self,
        client: stdsocket.socket,
        upstream: stdsocket.socket,
        counts: list[int],
        answer: bytes,
        key: str,
        finish: Callable[[], None],
    ) -> bool:
        """Move bytes both ways until both sides are done (half-closes passed on), an error,
        or ``idle_timeout_s`` without a byte; ``answer`` (not counted) goes to the client
        before the first bytes from upstream. True: the relay thread took the tunnel (both
        sockets are its own now, and it has ``finish`` run when the tunnel is over); False:
        carried here in trio tasks (no relay thread), over when this returns."""
        relay = self._relay_thread
        if relay is not None and relay.running:
            relay.add(egress_relay.Tunnel(client, upstream, counts, finish, answer=answer, key=key))
            return True
        limits = self.limits
        await egress_io.splice_both(
            client, upstream, counts, answer, limits.chunk, limits.idle_timeout_s
        )
        return False


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
