"""What hosted MCP servers offer besides tools: resources, resource templates, prompts and
completions (PROTOCOL 3.4, section 6's ``resources.*``, ``prompts.*``, ``completion.complete``),
resource subscriptions and list changes.

# Strategy: nothing is asked of a server to answer a list. Each MCP worker's session keeps its
# server's lists (``McpClient.offer``, read at start and on the server's list_changed), so a list
# is the union of what the ready workers of available sidecars already hold, in registry order
# (``host/offer_lists.py``): a URI or prompt name two servers publish belongs to the first
# sidecar, and the other's is reported shadowed (:meth:`HostedOffers.shadowed`), never dropped
# silently. A server that is down or hanging contributes nothing and slows nothing. Reads, gets
# and completions go to the owner's ready worker (the least busy), each within a deadline; a URI
# no server lists is tried against the owners of matching templates (by the template's literal
# prefix).
#
# Subscriptions are counted per URI across kernel sessions: the first subscriber of a URI
# subscribes its owner's sessions (every worker of the owning sidecar, through
# ``McpClient.sync_subscriptions``), the last one to leave unsubscribes them, and every new
# worker of that sidecar is handed the host's URIs when it is made (:meth:`attach`), so a
# restarted server is subscribed again; when the owner of a subscribed URI changes (the owner
# went and a shadowed server offers it, or the first-in-registry one is back), the subscription
# moves with it (:meth:`_rehome`, at each change of the lists). A server's
# ``notifications/resources/updated`` for a subscribed URI reaches every subscriber. List
# changes are found, not told: at every change of a pool (a worker ready or gone, a sidecar
# stopped or back) and every list_changed a server sends, :meth:`watch` compares what the
# lists hold with what they held, and calls the watchers with the kinds that really changed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec
import trio

from supervisor.host.catalog_feed import CatalogFeed
from supervisor.host.offer_lists import KEYS, clients_of, owned, sessions
from supervisor.host.views import HostViews
from supervisor.policy.results import unreadable
from supervisor.protocols.mcp import Result
from supervisor.workers.mcp_client import McpClient

DEFAULT_TIMEOUT_S = 30.0

LIST_KINDS = {"resources": ("resources", "resourceTemplates"), "prompts": ("prompts",)}
"""What a list change names (``resources`` covers the templates too), and the lists it covers."""

Deliver = Callable[[str], None]
"""Called with the URI of a subscribed resource that changed."""
OnLists = Callable[[tuple[str, ...]], None]
"""Called with the kinds of list that changed (``resources``, ``prompts``)."""


class OfferError(Exception):
    """What the kernel answers instead (``code``: ``not-found``, ``unavailable``, ``failed``)."""

    def __init__(self, code: str, message: str, data: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.data = data


class HostedOffers:
    """The resources, templates and prompts of the host's MCP servers, and requests to them.

    Args:
        views: The host's views (its plan and pools).
        feed: The catalog feed, whose pulses :meth:`watch` follows (None: no list changes).
    """

    def __init__(self, views: HostViews, feed: CatalogFeed | None = None) -> None:
        self.views = views
        self.feed = feed
        self._subscribers: dict[str, dict[object, Deliver]] = {}
        """Per URI, who subscribed (by session key) and how to tell them."""
        self._subscribed: dict[str, str] = {}
        """Per subscribed URI, the sidecar subscribed at: its owner now, or the last one while
        no available server offers it (renewed there when it comes back)."""
        self._watchers: dict[object, OnLists] = {}
        self._seen: dict[str, bytes] = {}

    def _sessions(self) -> list[tuple[str, list[McpClient]]]:
        return sessions(self.views.loaded.plan.sidecars, self.views.pools)

    def _owned(self, key: str) -> tuple[list[dict[str, Any]], list[dict[str, str]]]:
        return owned(self._sessions(), key)

    def listed(self, key: str) -> list[dict[str, Any]]:
        """``resources``, ``resourceTemplates`` or ``prompts`` of available sidecars."""
        return self._owned(key)[0]

    def shadowed(self, keys: tuple[str, ...] = tuple(KEYS)) -> list[dict[str, str]]:
        """Every URI, template and prompt name (of ``keys``) hidden by a sidecar earlier in the
        registry: ``{uri|uriTemplate|name, sidecar, shadowedBy}``."""
        return [s for key in keys for s in self._owned(key)[1]]

    def _owner(self, key: str, name: str) -> str | None:
        ident = KEYS[key]
        for item in self.listed(key):
            if item.get(ident) == name:
                return str(item["sidecar"])
        return None

    def _template_owner(self, uri: str) -> str | None:
        for item in self.listed("resourceTemplates"):
            template = item.get("uriTemplate")
            if isinstance(template, str) and uri.startswith(template.split("{", 1)[0]):
                return str(item["sidecar"])
        return None

    def _pick(self, sid: str) -> McpClient:
        for owner, ready in self._sessions():
            if owner == sid:
                return min(ready, key=lambda s: s.calls.running())
        raise OfferError("unavailable", f"MCP server {sid} is not available")

    def owner_of_uri(self, uri: str) -> str:
        sid = self._owner("resources", uri) or self._template_owner(uri)
        if sid is None:
            raise OfferError("not-found", f"no available MCP server offers resource {uri!r}")
        return sid

    def owner_of_prompt(self, name: str) -> str:
        sid = self._owner("prompts", name)
        if sid is None:
            raise OfferError("not-found", f"no available MCP server offers prompt {name!r}")
        return sid

    async def request(
        self,
        sid: str,
        method: str,
        params: dict[str, Any],
        name: str | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> Result:
        """Ask sidecar ``sid``'s server ``method``; its result as the JSON the server sent (the
        host passes it on as it is: a 1 MiB ``resources/read`` is never decoded and encoded
        again here, and arrives as its members, split in the pass that read its line).

        Raises:
            OfferError: The server is not available, did not answer in time, or answered with
                an error (``failed``, with its JSON-RPC code in ``data``).
        """
        session = self._pick(sid)
        if name is None:
            name = _mcp_name(method, params)
        response = await session.ask(method, params, name, timeout_s)
        if response is None:
            raise no_answer(sid, method)
        if response.error is not None:
            raise _failed(sid, response)
        return _readable(sid, method, response.result)

    def request_soon(
        self,
        sid: str,
        method: str,
        params: dict[str, Any],
        done: Callable[[Result | None, OfferError | None], None],
    ) -> Callable[[], None]:
        """:meth:`request` with no task waiting: ``done`` is called with the result or the
        error from the task that reads the server's answer (or that sees the worker end).
        Returns what abandons it (a timeout, a cancel): the server is told and ``done`` is not
        called.

        Raises:
            OfferError: The server is not available (nothing was sent).
        """
        session = self._pick(sid)

        def answered(response: Any) -> None:
            if response is None:  # the worker ended first (it was killed, it crashed)
                ended = f"MCP server {sid} ended before it answered {method}"
                done(None, OfferError("unavailable", ended))
            elif response.error is not None:
                done(None, _failed(sid, response))
            else:
                try:
                    result = _readable(sid, method, response.result)
                except OfferError as exc:
                    done(None, exc)
                else:
                    done(result, None)

        rid = session.ask_soon(method, params, _mcp_name(method, params), answered)
        if rid is None:  # its worker ended since it was picked
            raise OfferError("unavailable", f"MCP server {sid} is not available")
        return lambda: session.abandon(rid)

    # subscriptions -----------------------------------------------------------------------

    def attach(self, sidecar: str, client: McpClient) -> None:
        """Wire a new MCP worker's session of ``sidecar`` (before it starts): it subscribes to
        the host's URIs that sidecar owns, its updates reach the subscribers, and a change of
        its lists wakes :meth:`watch`."""
        client.subscriptions = self.wanted(sidecar)
        client.on_updated = lambda uri: self._updated(sidecar, uri)
        feed = self.feed
        if feed is not None:
            client.on_offer = feed.pulse

    def wanted(self, sidecar: str) -> set[str]:
        """The URIs the host is subscribed to at ``sidecar``."""
        return {uri for uri, sid in self._subscribed.items() if sid == sidecar}

    def subscribe(self, uri: str, key: object, deliver: Deliver) -> None:
        """``key`` (a kernel session) follows ``uri``: ``deliver(uri)`` at each update.

        Raises:
            OfferError: No available server offers ``uri`` (``not-found``).
        """
        sid = self._subscribed.get(uri)
        if sid is None:
            sid = self.owner_of_uri(uri)
            self._subscribed[uri] = sid
            self._subscribers[uri] = {}
            self._sync(sid)
        self._subscribers[uri][key] = deliver

    def unsubscribe(self, uri: str, key: object) -> bool:
        """``key`` no longer follows ``uri`` (False when it did not); the last one to go
        unsubscribes the server."""
        subs = self._subscribers.get(uri)
        if subs is None or subs.pop(key, None) is None:
            return False
        if not subs:
            del self._subscribers[uri]
            sid = self._subscribed.pop(uri)
            self._sync(sid)
        return True

    def drop(self, key: object) -> None:
        """``key`` left (its connection closed): every subscription of it ends."""
        self._watchers.pop(key, None)
        for uri in [u for u, subs in self._subscribers.items() if key in subs]:
            self.unsubscribe(uri, key)

    def subscriptions(self) -> dict[str, dict[str, Any]]:
        """Each subscribed URI: its sidecar and how many subscribe to it."""
        return {
            uri: {"sidecar": sid, "subscribers": len(self._subscribers.get(uri, {}))}
            for uri, sid in sorted(self._subscribed.items())
        }

    def _sync(self, sidecar: str) -> None:
        pool = self.views.pools.get(sidecar)
        if pool is None:
            return
        uris = self.wanted(sidecar)
        for client in clients_of(pool):
            client.sync_subscriptions(uris)

    def _rehome(self) -> None:
        """Move each subscribed URI to the sidecar that owns it now (its owner went and a
        shadowed one took over, or the first-in-registry one came back); a URI nobody offers
        stays where it was."""
        moved: set[str] = set()
        for uri, sid in list(self._subscribed.items()):
            try:
                now = self.owner_of_uri(uri)
            except OfferError:
                continue
            if now != sid:
                self._subscribed[uri] = now
                moved |= {sid, now}
        for sidecar in sorted(moved):
            self._sync(sidecar)

    def _updated(self, sidecar: str, uri: str) -> None:
        if self._subscribed.get(uri) != sidecar:
            return
        for deliver in list(self._subscribers.get(uri, {}).values()):
            deliver(uri)

    # list changes ------------------------------------------------------------------------

    def watch_lists(self, key: object, on_lists: OnLists) -> None:
        """Call ``on_lists(kinds)`` whenever the resources (with templates) or prompts the host
        lists change (until :meth:`drop` of ``key``)."""
        self._watchers[key] = on_lists

    def _fingerprints(self) -> dict[str, bytes]:
        live = self._sessions()
        return {
            kind: msgspec.json.encode([owned(live, key)[0] for key in keys])
            for kind, keys in LIST_KINDS.items()
        }

    async def watch(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Follow the pools and the servers' list changes until cancelled (the host's task)."""
        feed = self.feed
        assert feed is not None
        self._seen = self._fingerprints()
        task_status.started()
        while True:
            await feed.wait_change()
            now = self._fingerprints()
            kinds = tuple(k for k in LIST_KINDS if now[k] != self._seen.get(k))
            self._seen = now
            if "resources" in kinds:
                self._rehome()
            if kinds:
                for on_lists in list(self._watchers.values()):
                    on_lists(kinds)


def no_answer(sid: str, method: str) -> OfferError:
    """Server ``sid`` did not answer ``method`` in time (or, for :meth:`HostedOffers.request`,
    was not ready or ended first)."""
    return OfferError("unavailable", f"MCP server {sid} did not answer {method} in time")


def _readable(sid: str, method: str, result: Result | None) -> Result:
    """The result of a hosted server's answer (``{}`` when it had none).

    Raises:
        OfferError: ``failed``: it holds JSON no client can read (a number past a double,
            :func:`~supervisor.policy.results.unreadable`; a long answer, whose members the
            reader split without decoding them, is not looked into).
    """
    if result is None:
        return msgspec.Raw(b"{}")
    if isinstance(result, msgspec.Raw):
        why = unreadable(result)
        if why is not None:
            message = f"{sid} answered {method} with JSON its clients cannot read ({why})"
            raise OfferError("failed", message, {"sidecar": sid})
    return result


def _failed(sid: str, response: Any) -> OfferError:
    return OfferError(
        "failed",
        f"{sid}: {response.error.message}",
        {"rpcCode": response.error.code, "sidecar": sid},
    )


def _mcp_name(method: str, params: dict[str, Any]) -> str | None:
    """The ``Mcp-Name`` of the stateless era's routing headers for ``method``."""
    key = {"resources/read": "uri", "prompts/get": "name"}.get(method)
    return str(params.get(key, "")) if key is not None else None
