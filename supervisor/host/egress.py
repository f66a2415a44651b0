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
# ``splice(2)``: they never enter Python; the counts are what ``splice`` reports delivered. The
# relay thread also accepts on the proxy's listeners and serves the usual connection whole, the
# trio loop not woken (:mod:`supervisor.host.egress_fast`: the head in the first read, an
# address literal, allowed, connected at once); anything else it hands to :meth:`_serve` here
# with the bytes read, the one place for names, refusals and waits. The open count per sidecar
# (the cap, ``open``) is shared by both threads (``egress_fast.Live``).
# Every connection, allowed or refused, ends in one audit record and counts in the sidecar's
# :class:`EgressStats` (a tunnel's when the trio loop next takes what the relay finished:
# at the next connection, ``statistics()``, or ``egress_relay.FLUSH_S`` after it ended).
"""

from __future__ import annotations

import logging
import math
import secrets
import socket as stdsocket
from collections.abc import Awaitable, Callable, Sequence

import msgspec
import trio

from supervisor.contracts.confine import EgressRecord, EgressStats
from supervisor.host import egress_io, egress_relay
from supervisor.host.egress_fast import (
    Client,
    EgressLimits,
    Handed,
    Live,
    Opened,
    Request,
    attempt,
    authenticate,
    record_of,
    unreachable,
)
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
    decide,
    literal_address,
    parse_rules,
)

log = logging.getLogger("toolhost.egress")

Resolver = Callable[[str, int], Awaitable[list[IPAddress]]]
Audit = Callable[[EgressRecord], None]


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
        fast: With the relay thread, let it also accept on the proxy's listeners and serve the
            usual connection whole (``host.egress_fast``); False: every connection's accept,
            head, check and connect in the trio thread, as before it.
    """

    def __init__(
        self,
        *,
        audit: Audit | None = None,
        resolver: Resolver = system_resolver,
        limits: EgressLimits | None = None,
        relay: bool = True,
        fast: bool = True,
    ) -> None:
        self.audit = audit
        self.relay = relay
        self.fast = fast
        self.resolver = resolver
        self.limits = limits or EgressLimits()
        self._nursery: trio.Nursery | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._scopes: dict[str, list[trio.CancelScope]] = {}
        self._tokens: dict[str, Client] = {}
        """Replaced whole on each change (the relay thread reads it without a lock)."""
        self._stats: dict[str, EgressStats] = {}
        self._live = Live()
        self.shared_port = 0
        self._relay_thread: egress_relay.Relay | None = None
        self.served_fast = 0
        """Connections the relay thread served whole (the fast path), since the start."""
        self.handed = 0
        """Connections the relay thread accepted and handed to the trio side."""

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
        self._token = trio.lowlevel.current_trio_token()
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                task_status.started(self)
                await trio.sleep_forever()
        finally:
            self._nursery = None
            self._relay_thread = None
            if relay is not None:
                relay.stop()  # the listeners it accepted on close with it

    @property
    def relay_thread_id(self) -> int:
        """The relay thread's id in the kernel (0: none), for benchmarks of its CPU."""
        return self._relay_thread.native_id if self._relay_thread is not None else 0

    def _start(self, key: str, listener: stdsocket.socket, client: Client | None, to: int) -> None:
        if self._nursery is None:
            raise RuntimeError("the egress proxy is not running")
        relay = self._relay_thread
        if self.fast and not to and relay is not None and relay.running:

            def take(entry: egress_relay.Listener, conn: stdsocket.socket) -> None:
                self._take(entry, conn, client)

            relay.listen(egress_relay.Listener(listener, key, take))
            return
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
        self._tokens = {**self._tokens, token: client}
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
            if worker:  # the shared port ("") is no one's to close
                self._relay_thread.unlisten(worker)
            self._relay_thread.cut(worker)
        self._tokens = {t: c for t, c in self._tokens.items() if (c.worker or c.sidecar) != worker}

    def statistics(self) -> dict[str, EgressStats]:
        """Per sidecar: connections, refusals, bytes in and out, open connections."""
        self._flush()  # the tunnels the relay ended since the trio loop last looked
        live = self._live.snapshot()
        for sidecar in live:
            self._stat(sidecar)
        return {k: msgspec.structs.replace(v, open=live.get(k, 0)) for k, v in self._stats.items()}

    def _flush(self) -> None:
        if self._relay_thread is not None:
            self._relay_thread.flush()

    # the fast path (in the relay thread) -------------------------------------------------

    def _take(
        self, entry: egress_relay.Listener, conn: stdsocket.socket, client: Client | None
    ) -> None:
        """A connection the relay thread accepted on ``entry``: served whole
        (``egress_fast.attempt``) or handed to the trio side with what was read. Runs in the
        relay thread, its lock held."""
        relay = self._relay_thread
        out = attempt(conn, client, self._tokens, self._live, self.limits)
        if out is None:
            conn.close()
            return
        if isinstance(out, Handed) or relay is None:
            self.handed += 1
            self._hand(entry, conn, client, out)
            return
        self.served_fast += 1
        request, counts, sidecar, rule = (
            out.request,
            out.counts,
            out.request.client.sidecar,
            out.rule,
        )
        self._live.add(sidecar, 1)

        def finish() -> None:
            self._record(request.record(True, rule, "", counts))

        def release() -> None:
            self._live.add(sidecar, -1)

        tunnel = egress_relay.Tunnel(
            conn,
            out.upstream,
            counts,
            finish,
            answer=out.answer,
            key=entry.key,
            release=release,
            own=True,
        )
        relay.carry(tunnel, to_client=out.to_client, to_upstream=out.to_upstream)

    def _hand(
        self,
        entry: egress_relay.Listener,
        conn: stdsocket.socket,
        client: Client | None,
        out: Handed | Opened,
    ) -> None:
        """Have the trio loop take a connection from the relay thread (through its token)."""
        try:
            if self._token is None:
                raise trio.RunFinishedError
            self._token.run_sync_soon(self._adopt, entry, conn, client, out)
        except trio.RunFinishedError:  # the proxy stops: nothing serves it any more
            _close(conn, out)

    def _adopt(
        self,
        entry: egress_relay.Listener,
        conn: stdsocket.socket,
        client: Client | None,
        out: Handed | Opened,
    ) -> None:
        """In the trio thread: the connection's task, under a scope that ``forget`` of its key
        cancels (as the listener's own tasks were), or the stop."""
        nursery = self._nursery
        if nursery is None or entry.closed or not isinstance(out, Handed):
            _close(conn, out)
            return
        scope = trio.CancelScope()
        scopes = self._scopes.setdefault(entry.key, [])
        scopes.append(scope)

        async def guarded() -> None:
            try:
                with scope:
                    await self._serve(conn, client, entry.key, out)
            finally:
                if scope in scopes:
                    scopes.remove(scope)

        nursery.start_soon(guarded)

    # connections (the trio side) ---------------------------------------------------------

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

    async def _serve(
        self,
        stream: stdsocket.socket,
        client: Client | None,
        key: str,
        handed: Handed | None = None,
    ) -> None:
        """A proxy connection, from its head (``handed``: what the relay thread read, and how
        far it got) to its tunnel or refusal."""
        with egress_io.Closing(stream):
            if handed is not None and handed.request is not None:  # checked: the connect
                await self._reach(stream, handed.request, key, handed.rule, handed.address, handed)
                return
            try:
                head, rest = await self._read_head(stream, handed.prefix if handed else b"")
                method, target, headers = parse_head(head)
                if client is None:
                    client = authenticate(self._tokens, headers)
                host, port = target_of(method, target)
            except Refusal as refusal:
                await reply(stream, refusal.status, refusal.reason, auth=refusal.status == 407)
                return
            except trio.TooSlowError:
                await reply(stream, 408, "the request head did not arrive in time")
                return
            except OSError:  # reset, or closed before the head ended
                return
            request = Request(client, method, target, headers, rest, host, port)
            self._flush()  # the tunnels it ended are recorded before this one's line
            count = self._live.count(client.sidecar)
            if count >= self.limits.per_sidecar:
                reason = f"sidecar {client.sidecar} has {count} egress connections open"
                # Recorded before the answer: the call that fails on it must find it.
                self._record(request.record(False, "too-many-connections", reason))
                await reply(stream, 503, reason)
                return
            decision = await self._decide(client, host, port)
            if not decision.allowed:
                self._record(request.record(False, decision.rule, decision.reason))
                await reply(stream, 403, decision.reason)
                return
            await self._reach(stream, request, key, decision.rule, decision.address)

    async def _reach(
        self,
        stream: stdsocket.socket,
        request: Request,
        key: str,
        rule: str,
        address: str,
        handed: Handed | None = None,
    ) -> None:
        """Connect to the checked ``address`` (or finish the relay thread's connect:
        ``handed``), then the tunnel; a connection not made is answered and audited."""
        try:
            if handed is not None and handed.refusal is not None:
                raise handed.refusal
            started = handed.upstream if handed is not None else None
            upstream = await self._connect(address, request.port, started)
        except Refusal as refusal:  # allowed, but not reached: no connection was made
            reason = f"{request.host}:{request.port} ({address}) {refusal.reason}"
            self._record(request.record(False, refusal.rule, reason))
            await reply(stream, refusal.status, reason)
            return
        sidecar = request.client.sidecar
        self._live.add(sidecar, 1)
        counts = [0, 0]

        def finish() -> None:
            self._record(request.record(True, rule, "", counts))

        def release() -> None:
            self._live.add(sidecar, -1)

        handed_on = False  # to the relay thread, with both sockets, `finish` and `release`
        try:
            with egress_io.Closing(upstream):
                handed_on = await self._forward(
                    stream, upstream, request, counts, key, finish, release
                )
        finally:
            if not handed_on:
                release()
                finish()

    async def _read_head(self, stream: stdsocket.socket, prefix: bytes) -> tuple[bytes, bytes]:
        """The request head (without the blank line) and what came after it, ``prefix`` the
        bytes already read: at once when that or the first read holds it all (the listener woke
        on it), else within ``first_bytes_s`` for the first byte and ``head_timeout_s`` for the
        whole head.

        Raises:
            Refusal: 431, the head is over ``max_head``.
            trio.TooSlowError: It did not arrive in time.
            OSError: Reset, or closed before the head ended.
        """
        limits = self.limits
        buf = bytearray(prefix)
        try:
            data = stream.recv(4096)
            if not data:
                raise ConnectionError("closed before the head ended")
            buf += data
        except BlockingIOError:
            pass
        end = buf.find(b"\r\n\r\n")
        if 0 <= end <= limits.max_head:  # the usual case: no deadline to set up
            return bytes(buf[:end]), bytes(buf[end + 4 :])
        start = trio.current_time()
        first = min(limits.first_bytes_s, limits.head_timeout_s)
        with trio.CancelScope(deadline=start + (limits.head_timeout_s if buf else first)) as scope:
            while True:
                end = buf.find(b"\r\n\r\n")
                if 0 <= end <= limits.max_head:
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

    async def _connect(
        self, address: str, port: int, started: stdsocket.socket | None = None
    ) -> stdsocket.socket:
        """A connection to the checked address (``started``: one the relay thread began).

        Raises:
            Refusal: 502 (refused, unreachable) or 504 (no answer in ``connect_timeout_s``),
                rule ``unreachable``.
        """
        try:
            if started is not None:
                sock, done = started, False
            else:
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
            raise unreachable(exc) from None

    async def _forward(
        self,
        stream: stdsocket.socket,
        upstream: stdsocket.socket,
        request: Request,
        counts: list[int],
        key: str,
        finish: Callable[[], None],
        release: Callable[[], None],
    ) -> bool:
        """Send what goes first, then carry the tunnel; True when the relay thread took it."""
        answer, rest = b"", request.rest
        try:
            if request.method == "CONNECT" and rest:
                # The client sent its request without waiting for the 200 (the web sidecar
                # does): the 200 goes out with the first bytes of the answer.
                answer = ESTABLISHED
                await egress_io.send_all(upstream, rest)
                counts[1] += len(rest)
            elif request.method == "CONNECT":
                await egress_io.send_all(stream, ESTABLISHED)
            else:
                out = origin_request(
                    request.method, request.target, request.host, request.port, request.headers
                )
                await egress_io.send_all(upstream, out + rest)
                counts[1] += len(out) + len(rest)
        except OSError:
            return False
        return await self._carry(stream, upstream, counts, answer, key, finish, release)

    async def _relay(self, stream: stdsocket.socket, client: Client, port: int, key: str) -> None:
        rule = "confine.network.loopback"
        counts = [0, 0]
        self._flush()
        with egress_io.Closing(stream):
            try:
                upstream = await self._connect("127.0.0.1", port)
            except Refusal as refusal:
                why = f"127.0.0.1:{port} {refusal.reason}"
                self._record(record_of(client, "127.0.0.1", port, "TCP", False, refusal.rule, why))
                return
            self._live.add(client.sidecar, 1)

            def finish() -> None:
                self._record(record_of(client, "127.0.0.1", port, "TCP", True, rule, "", counts))

            def release() -> None:
                self._live.add(client.sidecar, -1)

            handed = False
            try:
                with egress_io.Closing(upstream):
                    handed = await self._carry(stream, upstream, counts, b"", key, finish, release)
            finally:
                if not handed:
                    release()
                    finish()

    async def _carry(
        self,
        client: stdsocket.socket,
        upstream: stdsocket.socket,
        counts: list[int],
        answer: bytes,
        key: str,
        finish: Callable[[], None],
        release: Callable[[], None],
    ) -> bool:
        """Move bytes both ways until both sides are done (half-closes passed on), an error,
        or ``idle_timeout_s`` without a byte; ``answer`` (not counted) goes to the client
        before the first bytes from upstream. True: the relay thread took the tunnel (both
        sockets are its own now, and it runs ``release`` when it closed them and has
        ``finish`` run in this thread); False: carried here in trio tasks (no relay thread),
        over when this returns."""
        relay = self._relay_thread
        if relay is not None and relay.running:
            tunnel = egress_relay.Tunnel(
                client, upstream, counts, finish, answer=answer, key=key, release=release
            )
            relay.add(tunnel)
            return True
        limits = self.limits
        await egress_io.splice_both(
            client, upstream, counts, answer, limits.chunk, limits.idle_timeout_s
        )
        return False


def _close(conn: stdsocket.socket, out: Handed | Opened) -> None:
    egress_io.close(conn)
    if out.upstream is not None:
        egress_io.close(out.upstream)


def _listening(listener: stdsocket.socket) -> None:
    """Non-blocking, and ``TCP_NODELAY`` for every connection it takes (Linux copies it to an
    accepted socket: a tunnel's last short segment must not wait for an ACK)."""
    listener.setblocking(False)
    listener.setsockopt(stdsocket.IPPROTO_TCP, stdsocket.TCP_NODELAY, 1)
