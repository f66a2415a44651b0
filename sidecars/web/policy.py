"""The web sidecar's network policy and limits: pure functions, no I/O.

SSRF policy: a destination is checked on every address its host resolves to (and again on every
redirect hop, and for every new connection), and the connection is then made to the checked
address. By default loopback, private, link-local, multicast, unspecified, reserved and other
non-global addresses are refused; an IPv6 address that embeds an IPv4 one (mapped
``::ffff:127.0.0.1``, 6to4 ``2002:7f00:1::``, NAT64 ``64:ff9b::7f00:1``) is judged as that one.
``config.allowPrivate: true`` opens every address;
``config.allowHosts`` opens listed host names (``example.org``, ``*.corp.example``) and networks
(``10.0.0.0/8``, ``::1/128``). Search providers' hosts are allowed implicitly: the operator
configured them.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from typing import Any

from supervisor.policy.egress import embedded_ipv4

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


class ConfigError(ValueError):
    """A malformed web sidecar config value (message names the key)."""


def classify(address: IPAddress) -> str | None:
    """Why ``address`` is refused by default (``loopback``, ``private``...), or ``None``."""
    if isinstance(address, ipaddress.IPv6Address):
        embedded = embedded_ipv4(address)  # mapped, 6to4, NAT64, IPv4-compatible
        if embedded is not None:
            address = embedded
    if address.is_unspecified:
        return "unspecified"
    if address.is_loopback:
        return "loopback"
    if address.is_link_local:
        return "link-local"
    if address.is_multicast:
        return "multicast"
    if address.is_private:
        return "private"
    if address.is_reserved:
        return "reserved"
    if not address.is_global:
        return "non-global"
    return None


class Policy:
    """Which destinations the web tools may connect to."""

    def __init__(
        self,
        *,
        allow_private: bool = False,
        hosts: Iterable[str] = (),
        networks: Iterable[IPNetwork] = (),
    ) -> None:
        self.allow_private = allow_private
        self.exact: set[str] = set()
        self.suffixes: list[str] = []
        for host in hosts:
            host = host.lower().rstrip(".")
            if host.startswith("*."):
                self.suffixes.append(host[1:])
            else:
                self.exact.add(host)
        self.networks = list(networks)

    def host_allowed(self, host: str) -> bool:
        """Whether ``host`` (a name) is on the allow-list."""
        name = host.lower().rstrip(".")
        return name in self.exact or any(name.endswith(s) for s in self.suffixes)

    def refusal(self, host: str, addresses: Iterable[str]) -> tuple[str, str] | None:
        """The first refused ``(address, category)`` among ``host``'s resolved addresses.

        Args:
            host: The host name (or literal) from the URL.
            addresses: Every address it resolved to (strings; IPv6 scope ids allowed).

        Returns:
            ``None`` when every address may be used, else the refused address and why.
        """
        if self.allow_private or self.host_allowed(host):
            return None
        for text in addresses:
            address = ipaddress.ip_address(text.split("%", 1)[0])
            if any(address in net for net in self.networks):
                continue
            why = classify(address)
            if why is not None:
                return text, why
        return None


def policy_from_config(config: Mapping[str, Any], extra_hosts: Iterable[str] = ()) -> Policy:
    """Build the policy from ``allowPrivate`` and ``allowHosts`` (names or CIDR networks).

    Raises:
        ConfigError: For a wrong type or an unparsable entry.
    """
    allow_private = config.get("allowPrivate", False)
    if not isinstance(allow_private, bool):
        raise ConfigError("config.allowPrivate must be true or false")
    raw = config.get("allowHosts", [])
    if not isinstance(raw, list) or not all(isinstance(h, str) and h for h in raw):
        raise ConfigError("config.allowHosts must be a list of host names or CIDR networks")
    hosts: list[str] = list(extra_hosts)
    networks: list[IPNetwork] = []
    for entry in raw:
        try:
            networks.append(ipaddress.ip_network(entry, strict=False))
        except ValueError:
            hosts.append(entry)
    return Policy(allow_private=allow_private, hosts=hosts, networks=networks)


class Limits:
    """Per-call limits from the config (``maxBytes``, ``maxDownloadBytes``, ``timeoutMs``,
    ``maxRedirects``, ``extractContentTypes``, ``userAgent``)."""

    def __init__(self, config: Mapping[str, Any]) -> None:
        self.max_bytes = _positive(config, "maxBytes", 10 << 20)
        self.max_download_bytes = _positive(config, "maxDownloadBytes", 100 << 20)
        self.timeout_ms = _positive(config, "timeoutMs", 30_000)
        self.max_redirects = _positive(config, "maxRedirects", 5, allow_zero=True)
        types = config.get(
            "extractContentTypes", ["text/html", "application/xhtml+xml", "text/plain"]
        )
        if not isinstance(types, list) or not all(isinstance(t, str) for t in types):
            raise ConfigError("config.extractContentTypes must be a list of media types")
        self.extract_types = [t.lower() for t in types]
        agent = config.get("userAgent", "toolhost-web/1.0")
        if not isinstance(agent, str):
            raise ConfigError("config.userAgent must be a string")
        self.user_agent = agent


def _positive(
    config: Mapping[str, Any], key: str, default: int, *, allow_zero: bool = False
) -> int:
    value = config.get(key, default)
    low = 0 if allow_zero else 1
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise ConfigError(f"config.{key} must be an integer >= {low}, got {value!r}")
    return value


def media_type(content_type: str | None) -> str:
    """``text/html; charset=utf-8`` -> ``text/html`` (lower case; empty when absent)."""
    return (content_type or "").split(";", 1)[0].strip().lower()
