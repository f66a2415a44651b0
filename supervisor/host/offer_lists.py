"""What the ready MCP sessions of a host's pools publish, and who shadows whom (PROTOCOL 3.4).

# Strategy: pure reading of the pools, shared by the offers (``host/offers.py``: lists, owners,
# subscriptions) and the views (``host/views.py``: each sidecar's ``shadowed`` in its status).
# A list is the union of what the first ready session of each available sidecar already holds
# (``McpClient.offer``), in registry order; a URI, template or prompt name two sidecars publish
# belongs to the first, and the other's entry is *shadowed*. Tools collide the same way in the
# catalog (``CatalogState.owner``): a tool this sidecar's server announces that the catalog
# gives to another sidecar is shadowed by it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from supervisor.workers.base import Worker
from supervisor.workers.mcp_client import McpClient

KEYS = {"resources": "uri", "resourceTemplates": "uriTemplate", "prompts": "name"}
"""Each list and the field that names its items."""
KINDS = {"resources": "resource", "resourceTemplates": "resourceTemplate", "prompts": "prompt"}
"""Each list and what one of its items is called in a ``shadowed`` row."""


class PoolLike(Protocol):
    @property
    def workers(self) -> Iterable[Worker]: ...


def session_of(worker: Worker) -> McpClient | None:
    """The worker's MCP session when it is ready."""
    mcp = getattr(worker, "mcp", None)
    return mcp if isinstance(mcp, McpClient) and worker.state == "ready" else None


def clients_of(pool: PoolLike) -> list[McpClient]:
    """Every MCP session of ``pool``, ready or not (subscriptions are kept on each)."""
    return [m for w in list(pool.workers) if isinstance(m := getattr(w, "mcp", None), McpClient)]


def sessions(
    order: Iterable[str], pools: Mapping[str, PoolLike]
) -> list[tuple[str, list[McpClient]]]:
    """Sidecar id and its ready MCP sessions, in registry order (available ones only)."""
    out = []
    for sid in order:
        pool = pools.get(sid)
        if pool is None:
            continue
        ready = [s for w in list(pool.workers) if (s := session_of(w)) is not None]
        if ready:
            out.append((sid, ready))
    return out


def owned(
    live: list[tuple[str, list[McpClient]]], key: str
) -> tuple[list[dict[str, Any]], list[dict[str, str]]]:
    """The items of list ``key`` (each with its ``sidecar``) and the shadowed ones
    (``{uri|uriTemplate|name, sidecar, shadowedBy}``)."""
    ident = KEYS[key]
    seen: dict[str, str] = {}
    items: list[dict[str, Any]] = []
    shadowed: list[dict[str, str]] = []
    for sid, ready in live:
        for item in ready[0].offer.get(key, []):
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


def shadowed_of(
    sidecar: str,
    live: list[tuple[str, list[McpClient]]],
    tool_owner: Mapping[str, str | None],
) -> list[dict[str, str]]:
    """What of ``sidecar`` is shadowed, and by which sidecar: ``{kind, name, shadowedBy}``
    with ``kind`` one of ``tool``, ``resource``, ``resourceTemplate``, ``prompt``.

    Args:
        sidecar: The sidecar asked about.
        live: :func:`sessions` of the host.
        tool_owner: The catalog's owner of each tool ``sidecar``'s server announces.
    """
    out = [
        {"kind": "tool", "name": name, "shadowedBy": owner}
        for name, owner in sorted(tool_owner.items())
        if owner is not None and owner != sidecar
    ]
    for key, kind in KINDS.items():
        ident = KEYS[key]
        for row in owned(live, key)[1]:
            if row["sidecar"] == sidecar:
                out.append({"kind": kind, "name": row[ident], "shadowedBy": row["shadowedBy"]})
    return out
