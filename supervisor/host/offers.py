"""What hosted MCP servers offer besides tools: resources, resource templates, prompts and
completions (PROTOCOL 3.4, section 6's ``resources.*``, ``prompts.*``, ``completion.complete``).

# Strategy: nothing is asked of a server to answer a list. Each MCP worker's session keeps its
# server's lists (``McpClient.offer``, read at start and on the server's list_changed), so a list
# is the union of what the ready workers of available sidecars already hold, in registry order:
# a URI or prompt name two servers publish belongs to the first sidecar, and the other's is
# reported shadowed (:meth:`HostedOffers.shadowed`), never dropped silently. A server that is
# down or hanging contributes nothing and slows nothing. Reads, gets and completions go to the
# owner's ready worker (the least busy), each within a deadline; a URI no server lists is tried
# against the owners of matching templates (by the template's literal prefix).
"""

from __future__ import annotations

from typing import Any

import msgspec

from supervisor.host.views import HostViews
from supervisor.workers.base import Worker
from supervisor.workers.mcp_client import McpClient

DEFAULT_TIMEOUT_S = 30.0

KEYS = {"resources": "uri", "resourceTemplates": "uriTemplate", "prompts": "name"}


class OfferError(Exception):
    """What the kernel answers instead (``code``: ``not-found``, ``unavailable``, ``failed``)."""

    def __init__(self, code: str, message: str, data: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.data = data


def _session(worker: Worker) -> McpClient | None:
    mcp = getattr(worker, "mcp", None)
    return mcp if isinstance(mcp, McpClient) and worker.state == "ready" else None


class HostedOffers:
    """The resources, templates and prompts of the host's MCP servers, and requests to them."""

    def __init__(self, views: HostViews) -> None:
        self.views = views

    def _sessions(self) -> list[tuple[str, list[McpClient]]]:
        """Sidecar id and its ready MCP sessions, in registry order (available ones only)."""
        out = []
        pools = self.views.pools
        for sid in self.views.loaded.plan.sidecars:
            pool = pools.get(sid)
            if pool is None:
                continue
            sessions = [s for w in list(pool.workers) if (s := _session(w)) is not None]
            if sessions:
                out.append((sid, sessions))
        return out

    def _owned(self, key: str) -> tuple[list[dict[str, Any]], list[dict[str, str]]]:
        ident = KEYS[key]
        seen: dict[str, str] = {}
        items: list[dict[str, Any]] = []
        shadowed: list[dict[str, str]] = []
        for sid, sessions in self._sessions():
            for item in sessions[0].offer.get(key, []):
                name = item.get(ident)
                if not isinstance(name, str):
                    continue
                owner = seen.get(name)
                if owner is not None:
                    if owner != sid:
                        shadowed.append({ident: name, "sidecar": sid, "shadowedBy": owner})
                    continue
                seen[name] = sid
                items.append({**item, "sidecar": sid})
        return items, shadowed

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
        for owner, sessions in self._sessions():
            if owner == sid:
                return min(sessions, key=lambda s: s.calls.running())
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
    ) -> msgspec.Raw:
        """Ask sidecar ``sid``'s server ``method``; its result as the JSON the server sent (the
        host passes it on as it is: a 1 MiB ``resources/read`` is never decoded and encoded
        again here).

        Raises:
            OfferError: The server is not available, did not answer in time, or answered with
                an error (``failed``, with its JSON-RPC code in ``data``).
        """
        session = self._pick(sid)
        if name is None:  # the Mcp-Name of the stateless era's routing headers
            key = {"resources/read": "uri", "prompts/get": "name"}.get(method)
            name = str(params.get(key, "")) if key is not None else None
        response = await session.ask(method, params, name, timeout_s)
        if response is None:
            raise OfferError("unavailable", f"MCP server {sid} did not answer {method} in time")
        if response.error is not None:
            raise OfferError(
                "failed",
                f"{sid}: {response.error.message}",
                {"rpcCode": response.error.code, "sidecar": sid},
            )
        return response.result if response.result is not None else msgspec.Raw(b"{}")
