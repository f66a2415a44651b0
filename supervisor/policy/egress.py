"""Egress rules (PROTOCOL 7 ``confine.network.allow``): which destinations a sidecar may reach
through the host's proxy, decided after the host resolved the name.

# Strategy: pure functions over parsed rules and ``ipaddress`` objects; the proxy
# (``supervisor.host.egress``) resolves names and calls :func:`decide` with every address it got.
# A rule names a host (``api.example.com:443``), a domain's subdomains (``*.example.com:443``),
# an address (``10.0.0.5:8080``, ``[fd00::1]:80``) or anything public (``*``). Only a rule that
# names an address can open a non-public one (private, loopback, link-local, metadata,
# unspecified, multicast, reserved): a name that resolves to 127.0.0.1 is refused whatever
# names it, so DNS rebinding and ``localtest.me`` tricks reach nothing.
"""

from __future__ import annotations

import functools
import ipaddress
import re
from collections.abc import Iterable, Sequence
from typing import Literal

from msgspec import Struct

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
AddressClass = Literal["public", "private", "loopback", "link-local", "metadata"]

METADATA = frozenset(
    ipaddress.ip_address(a)
    for a in (
        "169.254.169.254",  # AWS, GCP, Azure, OpenStack, DigitalOcean
        "169.254.170.2",  # AWS ECS task metadata
        "100.100.100.200",  # Alibaba Cloud
        "fd00:ec2::254",  # AWS over IPv6
    )
)
"""Cloud instance-metadata addresses: credentials live there."""

_LABEL = r"(?!-)[a-z0-9_-]{1,63}(?<!-)"
_NAME = re.compile(rf"^{_LABEL}(\.{_LABEL})*\.?$")
_PORT = re.compile(r"^[0-9]{1,5}$")
ANY = "*"


class Rule(Struct, frozen=True, kw_only=True):
    """One parsed ``allow`` entry."""

    text: str
    """As written (named in audit lines and refusals)."""
    host: str = ""
    """Lower-case name without a trailing dot, or the domain of a ``*.`` rule; empty for
    ``*`` and address rules."""
    subdomains: bool = False
    address: str = ""
    """The address of an address rule, normalised (``ipaddress`` text)."""
    port: int = 0
    """0: any port (only ``*``)."""


def parse_rule(text: str) -> Rule | str:
    """One rule, or a message saying what is wrong with it (for ``registry.check``)."""
    raw = text.strip()
    if raw == ANY:
        return Rule(text=text)
    if raw.startswith("["):
        end = raw.find("]")
        if end < 0 or raw[end + 1 : end + 2] != ":":
            return f"{text!r}: an IPv6 address is written [address]:port"
        host, port_text = raw[1:end], raw[end + 2 :]
    else:
        host, sep, port_text = raw.rpartition(":")
        if not sep or not host:
            return f"{text!r}: expected host:port, *.domain:port, address:port or *"
    if not _PORT.match(port_text) or not 1 <= int(port_text) <= 65535:
        return f"{text!r}: the port must be a number from 1 to 65535"
    port = int(port_text)
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        address = None
    if address is not None:
        return Rule(text=text, address=str(address), port=port)
    name = host.lower()
    subdomains = name.startswith("*.")
    if subdomains:
        name = name[2:]
    if "*" in name or not _NAME.match(name):
        return f"{text!r}: {host!r} is not a host name, *.domain or address"
    return Rule(text=text, host=name.rstrip("."), subdomains=subdomains, port=port)


def parse_rules(texts: Iterable[str]) -> tuple[list[Rule], list[str]]:
    """Every rule that parses, and one message per one that does not."""
    rules: list[Rule] = []
    problems: list[str] = []
    for text in texts:
        parsed = parse_rule(text)
        if isinstance(parsed, str):
            problems.append(parsed)
        else:
            rules.append(parsed)
    return rules, problems


NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
"""The well-known NAT64 prefix (RFC 6052): a translator sends ``64:ff9b::7f00:1`` to 127.0.0.1."""
NAT64_LOCAL = ipaddress.IPv6Network("64:ff9b:1::/48")
"""The local-use NAT64 prefix (RFC 8215)."""


def embedded_ipv4(address: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 one leads to, where it embeds one: IPv4-mapped, 6to4, the
    well-known NAT64 prefix, or the deprecated IPv4-compatible ``::a.b.c.d``."""
    mapped = address.ipv4_mapped or address.sixtofour
    if mapped is not None:
        return mapped
    value = int(address)
    if address in NAT64 or (value >> 32 == 0 and value > 1):  # not :: or ::1 themselves
        return ipaddress.IPv4Address(value & 0xFFFFFFFF)
    return None


def address_class(address: IPAddress) -> AddressClass:
    """``public`` or why not: loopback (also the unspecified address, which reaches this
    machine), link-local, metadata, or private (every other non-global range: RFC 1918, CGNAT,
    ULA, multicast, reserved, documentation). An IPv6 address that embeds an IPv4 one (mapped,
    6to4, NAT64, IPv4-compatible) is judged by that one."""
    if isinstance(address, ipaddress.IPv6Address):
        embedded = embedded_ipv4(address)
        if embedded is not None:
            return address_class(embedded)
        if address in NAT64_LOCAL:  # a site's own translator: where it leads is not known here
            return "private"
    if address in METADATA:
        return "metadata"
    if address.is_loopback or address.is_unspecified:
        return "loopback"
    if address.is_link_local:
        return "link-local"
    if address.is_multicast or not address.is_global:
        return "private"
    return "public"


class Decision(Struct, frozen=True, kw_only=True):
    """The answer for one destination."""

    allowed: bool
    rule: str
    """The rule that allowed it, or what refused it (``no-rule``, ``private-address``, ...)."""
    reason: str
    """One line for the ``403`` body and the log; names the rule or the grant that would
    allow it (``confine.network.allow``)."""
    address: str = ""
    """The address to connect to (the first one allowed), when allowed."""


def _name_matches(rule: Rule, host: str) -> bool:
    if rule.subdomains:
        return host.endswith("." + rule.host)
    return host == rule.host


def decide(rules: Sequence[Rule], host: str, port: int, addresses: Sequence[IPAddress]) -> Decision:
    """Whether ``host:port`` may be reached, given every address the host resolved it to.

    Args:
        rules: The sidecar's parsed ``allow`` rules.
        host: The name (or address literal) the client asked for.
        port: The port it asked for.
        addresses: What ``host`` resolved to (an address literal: itself), in the resolver's
            order; the first one allowed is the one to connect to.

    Returns:
        Allowed with the rule and address, or refused with a one-line reason.
    """
    name = host.lower().rstrip(".")
    shown = f"{host}:{port}"
    if not addresses:
        return Decision(
            allowed=False, rule="unresolved", reason=f"{shown}: the name resolves to no address"
        )
    named = [r for r in rules if r.address == "" and (r.host == "" or _name_matches(r, name))]
    named = [r for r in named if r.port in (0, port)]
    refused: list[str] = []
    for address in addresses:
        by_address = next(
            (r for r in rules if r.address == str(address) and r.port in (0, port)), None
        )
        if by_address is not None:
            return Decision(allowed=True, rule=by_address.text, reason="", address=str(address))
        kind = address_class(address)
        if kind != "public":
            refused.append(f"{address} ({kind})")
            continue
        if named:
            rule = named[0]
            return Decision(allowed=True, rule=rule.text, reason="", address=str(address))
    if named:  # a name rule matched, but every address it resolved to is non-public
        return Decision(
            allowed=False,
            rule=f"{address_class(addresses[0])}-address",
            reason=(
                f"{shown} resolves to {', '.join(refused)}: a non-public address is reached only"
                f' through a confine.network.allow rule naming it ("{addresses[0]}:{port}")'
            ),
        )
    listed = ", ".join(r.text for r in rules[:5]) + (", ..." if len(rules) > 5 else "")
    where = f" ({', '.join(refused)})" if refused else ""
    return Decision(
        allowed=False,
        rule="no-rule",
        reason=(
            f"{shown}{where} matches no confine.network.allow rule (allowed: {listed or 'nothing'})"
        ),
    )


EGRESS_PROXY_VAR = "TOOLHOST_EGRESS_PROXY"
"""Names the host's own egress proxy: a client may send its request right after the
``CONNECT`` head, without waiting for the ``200`` (that proxy forwards it once the tunnel is up
and drops it on a refusal; another proxy might not)."""


def proxy_env(url: str) -> dict[str, str]:
    """The variables that send a worker's HTTP clients through the proxy at ``url``
    (upper and lower case: libraries read either), with ``NO_PROXY`` emptied so none is
    bypassed, and :data:`EGRESS_PROXY_VAR` saying it is the host's."""
    env: dict[str, str] = {}
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):
        env[name] = url
        env[name.lower()] = url
    env["NO_PROXY"] = env["no_proxy"] = ""
    env[EGRESS_PROXY_VAR] = url
    return env


def sanitize_host(host: str) -> str | None:
    """``host`` as asked (a name or address literal, brackets removed), or None when it cannot
    be one (spaces, control characters, empty, over 253 characters)."""
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not host or len(host) > 253:
        return None
    address = literal_address(host)
    if address is not None:
        return str(address)
    return host if _NAME.match(host.lower()) else None


@functools.lru_cache(maxsize=256)  # the proxy asks for the same few on every connection
def literal_address(host: str) -> IPAddress | None:
    """``host`` as an address when it is one."""
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None
