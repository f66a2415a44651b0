"""Egress rules (PROTOCOL 7): parsing, address classes, and decisions after resolution."""

from __future__ import annotations

import ipaddress

import pytest

from supervisor.policy.egress import (
    Rule,
    address_class,
    decide,
    parse_rule,
    parse_rules,
    proxy_env,
    sanitize_host,
)


def ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    return ipaddress.ip_address(text)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("*", Rule(text="*")),
        ("api.example.com:443", Rule(text="api.example.com:443", host="api.example.com", port=443)),
        ("API.Example.com.:80", Rule(text="API.Example.com.:80", host="api.example.com", port=80)),
        (
            "*.example.com:443",
            Rule(text="*.example.com:443", host="example.com", subdomains=True, port=443),
        ),
        ("10.0.0.5:8080", Rule(text="10.0.0.5:8080", address="10.0.0.5", port=8080)),
        ("[::1]:9000", Rule(text="[::1]:9000", address="::1", port=9000)),
    ],
)
def test_rules_parse(text: str, expected: Rule) -> None:
    assert parse_rule(text) == expected


@pytest.mark.parametrize(
    ("text", "word"),
    [
        ("example.com", "expected host:port"),
        ("example.com:0", "1 to 65535"),
        ("example.com:70000", "1 to 65535"),
        ("example.com:http", "1 to 65535"),
        ("a.*.com:443", "not a host name"),
        ("*example.com:443", "not a host name"),
        ("ex ample.com:443", "not a host name"),
        ("[::1:443", "[address]:port"),
        (":443", "expected host:port"),
    ],
)
def test_bad_rules_say_what_is_wrong(text: str, word: str) -> None:
    problem = parse_rule(text)
    assert isinstance(problem, str) and word in problem and repr(text) in problem


def test_parse_rules_keeps_good_ones_and_reports_each_bad_one() -> None:
    rules, problems = parse_rules(["*", "x", "a.b:1", "y"])
    assert [r.text for r in rules] == ["*", "a.b:1"] and len(problems) == 2


@pytest.mark.parametrize(
    ("address", "kind"),
    [
        ("93.184.216.34", "public"),
        ("2606:4700::1111", "public"),
        ("127.0.0.1", "loopback"),
        ("127.8.9.1", "loopback"),
        ("0.0.0.0", "loopback"),
        ("::1", "loopback"),
        ("::", "loopback"),
        ("::ffff:127.0.0.1", "loopback"),
        ("::ffff:10.1.2.3", "private"),
        ("2002:0a00:0001::1", "private"),  # 6to4 of 10.0.0.1
        # NAT64 (RFC 6052) and the IPv4-compatible form: judged by the IPv4 address inside
        # (they were "public", so a name resolving to them passed an allow rule).
        ("64:ff9b::7f00:1", "loopback"),
        ("64:ff9b::a9fe:a9fe", "metadata"),
        ("64:ff9b::a00:1", "private"),
        ("64:ff9b::5db8:d822", "public"),
        ("64:ff9b:1::5db8:d822", "private"),  # a site's own translator (RFC 8215)
        ("::7f00:1", "loopback"),
        ("::a9fe:a9fe", "metadata"),
        ("::5db8:d822", "public"),
        ("10.1.2.3", "private"),
        ("172.16.0.1", "private"),
        ("192.168.1.1", "private"),
        ("100.64.0.1", "private"),
        ("fd12::1", "private"),
        ("224.0.0.1", "private"),
        ("169.254.1.1", "link-local"),
        ("fe80::1", "link-local"),
        ("169.254.169.254", "metadata"),
        ("fd00:ec2::254", "metadata"),
        ("100.100.100.200", "metadata"),
    ],
)
def test_address_classes(address: str, kind: str) -> None:
    assert address_class(ip(address)) == kind


RULES, _ = parse_rules(["api.example.com:443", "*.cdn.net:443", "10.0.0.5:8080", "[::1]:9000"])
ANY, _ = parse_rules(["*"])


@pytest.mark.parametrize(
    ("rules", "host", "port", "addresses", "allowed", "rule", "words"),
    [
        (RULES, "api.example.com", 443, ["93.184.216.34"], True, "api.example.com:443", []),
        (RULES, "API.EXAMPLE.COM.", 443, ["93.184.216.34"], True, "api.example.com:443", []),
        (RULES, "api.example.com", 80, ["93.184.216.34"], False, "no-rule", ["api.example.com:80"]),
        (RULES, "img.cdn.net", 443, ["93.184.216.35"], True, "*.cdn.net:443", []),
        (RULES, "a.b.cdn.net", 443, ["93.184.216.35"], True, "*.cdn.net:443", []),
        (RULES, "cdn.net", 443, ["93.184.216.35"], False, "no-rule", ["allowed: api.example.com"]),
        (RULES, "evilcdn.net", 443, ["93.184.216.35"], False, "no-rule", []),
        # a name rule never opens a non-public address: DNS rebinding reaches nothing
        (
            RULES,
            "api.example.com",
            443,
            ["127.0.0.1"],
            False,
            "loopback-address",
            ["127.0.0.1 (loopback)", "naming it"],
        ),
        (
            RULES,
            "api.example.com",
            443,
            ["10.0.0.9", "93.184.216.34"],
            True,
            "api.example.com:443",
            [],
        ),
        # an address rule opens exactly that address and port
        (RULES, "10.0.0.5", 8080, ["10.0.0.5"], True, "10.0.0.5:8080", []),
        (RULES, "internal.corp", 8080, ["10.0.0.5"], True, "10.0.0.5:8080", []),
        (RULES, "10.0.0.5", 8081, ["10.0.0.5"], False, "no-rule", ["(private)"]),
        (RULES, "::1", 9000, ["::1"], True, "[::1]:9000", []),
        (ANY, "example.org", 8443, ["93.184.216.34"], True, "*", []),
        (ANY, "localtest.me", 80, ["127.0.0.1"], False, "loopback-address", []),
        (ANY, "metadata.google.internal", 80, ["169.254.169.254"], False, "metadata-address", []),
        (ANY, "169.254.169.254", 80, ["169.254.169.254"], False, "metadata-address", []),
        (ANY, "x", 80, ["::ffff:127.0.0.1"], False, "loopback-address", []),
        (ANY, "nowhere.example", 80, [], False, "unresolved", ["resolves to no address"]),
        ([], "example.org", 443, ["93.184.216.34"], False, "no-rule", ["allowed: nothing"]),
    ],
)
def test_decisions_after_resolution(
    rules: list[Rule],
    host: str,
    port: int,
    addresses: list[str],
    allowed: bool,
    rule: str,
    words: list[str],
) -> None:
    d = decide(rules, host, port, [ip(a) for a in addresses])
    assert (d.allowed, d.rule) == (allowed, rule), d
    if allowed:
        assert d.address
        if d.rule == "*":
            assert address_class(ip(d.address)) == "public"
    else:
        assert d.reason and "\n" not in d.reason
        assert "confine.network.allow" in d.reason or rule == "unresolved"
    for w in words:
        assert w in d.reason


def test_the_allowed_address_is_the_first_public_one() -> None:
    d = decide(ANY, "x.org", 443, [ip("10.0.0.1"), ip("93.184.216.34"), ip("93.184.216.35")])
    assert d.allowed and d.address == "93.184.216.34"


def test_proxy_env_covers_both_cases_and_empties_no_proxy() -> None:
    env = proxy_env("http://127.0.0.1:3128")
    assert env["HTTPS_PROXY"] == env["http_proxy"] == env["ALL_PROXY"] == "http://127.0.0.1:3128"
    assert env["NO_PROXY"] == env["no_proxy"] == ""
    assert env["TOOLHOST_EGRESS_PROXY"] == "http://127.0.0.1:3128"  # the host's own


@pytest.mark.parametrize(
    ("host", "expected"),
    [
        ("Example.COM", "Example.COM"),
        ("[::1]", "::1"),
        ("127.0.0.1", "127.0.0.1"),
        ("", None),
        ("a b", None),
        ("a\r\nb", None),
        ("x" * 300, None),
    ],
)
def test_sanitize_host(host: str, expected: str | None) -> None:
    assert sanitize_host(host) == expected
