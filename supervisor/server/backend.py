"""What the kernel protocol talks to: the parts of one running host, handed to the server once.

# Strategy: the server never holds the host. Whoever starts it (``toolhost serve``, the embedded
# MCP face, the tests) builds one :class:`Backend` from a running host with :meth:`Backend.of`
# and hands it to the transports; every session and method reaches exactly these parts: the
# invoker (``tools.invoke``, ``tools.cancel``), the approvals, the views (snapshot, health,
# stats, logs), the catalog feed (``catalog.changed``, provider-safe names), the operator event
# bus, the upgrade service, the host's own controls (reload, restart a sidecar) and telemetry.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from supervisor.calls.approvals import Approvals
from supervisor.calls.invoke import Invoker
from supervisor.host.catalog_feed import CatalogFeed
from supervisor.host.host import Host
from supervisor.host.offers import HostedOffers
from supervisor.host.upgrades import Upgrades
from supervisor.host.views import HostViews
from supervisor.server.adopt import Adopter
from supervisor.telemetry.events import EventBus

if TYPE_CHECKING:
    from supervisor.telemetry.tracing import Tracing


class Backend:
    """The parts of a running host the kernel protocol reaches.

    Args:
        invoker: Starts and cancels tool calls.
        approvals: Calls waiting for an operator.
        views: What the host shows (snapshot, statuses, health, stats, logs).
        feed: ``catalog.changed`` subscriptions and provider-safe tool names.
        events: The operator event bus (``events.subscribe``).
        upgrades: The package operations (``packages.*``).
        control: Reloads the registry and restarts a sidecar (the host's lifecycle).
        telemetry: Spans of kernel requests (None: off).
        endpoints: Where the host serves (``server.hello``), filled in as transports start.
        offers: The hosted MCP servers' resources, prompts and completions (default: from
            ``views``).
        peer_refusal: Why a socket peer (by pid) is a confined sidecar process the kernel
            socket must refuse ("" if not; default: nobody is refused).
    """

    __slots__ = (
        "adopter",
        "approvals",
        "control",
        "endpoints",
        "events",
        "feed",
        "invoker",
        "offers",
        "peer_refusal",
        "telemetry",
        "upgrades",
        "views",
    )

    def __init__(
        self,
        *,
        invoker: Invoker,
        approvals: Approvals,
        views: HostViews,
        feed: CatalogFeed,
        events: EventBus,
        upgrades: Upgrades,
        control: Host,
        telemetry: Tracing | None,
        endpoints: dict[str, str],
        offers: HostedOffers | None = None,
        peer_refusal: Callable[[int], str] | None = None,
    ) -> None:
        self.invoker = invoker
        self.approvals = approvals
        self.views = views
        self.feed = feed
        self.events = events
        self.upgrades = upgrades
        self.control = control
        self.telemetry = telemetry
        self.endpoints = endpoints
        self.offers = offers if offers is not None else HostedOffers(views)
        self.peer_refusal: Callable[[int], str] = peer_refusal or _nobody
        self.adopter: Adopter | None = None
        """Serves the stdio MCP sessions ``toolhost mcp`` hands over (``mcp.adopt``); set by
        ``toolhost serve`` (None: the method is refused, the client keeps its relay)."""

    @classmethod
    def of(cls, host: Host) -> Backend:
        """The parts of ``host`` (a started one: its telemetry is known)."""
        return cls(
            invoker=host.invoker,
            approvals=host.approvals,
            views=host.views,
            feed=host.feed,
            events=host.events,
            upgrades=host.upgrades,
            control=host,
            telemetry=host.telemetry,
            endpoints=host.endpoints,
            offers=host.offers,
            peer_refusal=host.confiner.refusal,
        )


def _nobody(pid: int) -> str:
    return ""
