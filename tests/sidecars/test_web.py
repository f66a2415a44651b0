"""The web sidecar against a loopback HTTP server of the test: pages, redirects, limits, the
SSRF policy, downloads and a fake search provider. Tools run in-process through the SDK's
dispatch (``app.execute``: a fresh Trio loop per call); ``test_web_host.py`` runs the worker
under a real host."""

from __future__ import annotations

import hashlib
import ipaddress
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from sidecars.sdk import Context
from sidecars.web import app
from sidecars.web.policy import classify, policy_from_config
from supervisor.contracts import wire
from tests.sidecars.webserver import MAIN_WORDS, web_server


@pytest.fixture
def base(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    root = tmp_path / "project"
    root.mkdir()
    monkeypatch.setattr(app, "project_dir", str(root))
    monkeypatch.setattr(app, "config", {"allowPrivate": True})
    with web_server() as url:
        yield url


def run(tool: str, payload: dict[str, Any], deadline_ms: int = 20_000) -> wire.Result:
    return app.execute(
        tool, msgspec.json.encode(payload), Context(app, 1, deadline_ms, threading.Event())
    )


def ok(tool: str, payload: dict[str, Any], deadline_ms: int = 20_000) -> dict[str, Any]:
    result = run(tool, payload, deadline_ms)
    assert result.ok, (result.code, result.error, result.details)
    return msgspec.json.decode(result.data)


def refused(tool: str, payload: dict[str, Any], reason: str, code: str = "failed") -> wire.Result:
    result = run(tool, payload)
    assert not result.ok and result.code == code, (result.code, result.error, result.details)
    assert (result.details or {}).get("reason") == reason, result.details
    return result


# pages and extraction -----------------------------------------------------------------------


def test_fetch_text_is_the_main_text(base: str) -> None:
    data = ok("web.fetch", {"url": f"{base}/page"})
    assert data["status"] == 200 and data["contentType"].startswith("text/html")
    assert all(words in data["content"] for words in MAIN_WORDS)
    assert "cookie banner" not in data["content"] and "<p>" not in data["content"]
    raw = ok("web.fetch", {"url": f"{base}/page", "as": "raw"})
    assert raw["content"].startswith("<html>") and raw["bytes"] == len(raw["content"])
    md = ok("web.fetch", {"url": f"{base}/page", "as": "markdown"})
    assert "[the history of lamps](https://example.org/lamps)" in md["content"]
    image = ok("web.fetch", {"url": f"{base}/image"})
    assert image["encoding"] == "base64" and image["content"] == "iVBORy4uLi4="


def test_extract_gives_title_text_and_links(base: str) -> None:
    data = ok("web.extract", {"url": f"{base}/page"})
    assert data["title"] == "Lighthouse keeping"
    assert all(words in data["text"] for words in MAIN_WORDS)
    assert "cookie banner" not in data["text"]
    urls = [link["url"] for link in data["links"]]
    assert urls == [f"{base}/", f"{base}/about", "https://example.org/lamps"]
    Path(app.project_dir, "saved.html").write_text(
        "<html><head><title>Saved</title></head><body><article><p>"
        + "A saved page about tides and the moon pulling the sea. " * 5
        + "</p></article></body></html>"
    )
    saved = ok("web.extract", {"path": "saved.html"})
    assert saved["title"] == "Saved" and "tides and the moon" in saved["text"]
    refused("web.extract", {"url": f"{base}/image"}, "content-type", code="unsupported")
    refused("web.extract", {}, "url-or-path", code="invalid-input")


# redirects and limits -----------------------------------------------------------------------


def test_redirect_chain_is_followed_and_reported(base: str) -> None:
    data = ok("web.fetch", {"url": f"{base}/r/3"})
    assert data["url"] == f"{base}/page" and data["redirects"] == [
        f"{base}/r/2",
        f"{base}/r/1",
        f"{base}/page",
    ]
    app.config = {"allowPrivate": True, "maxRedirects": 2}
    result = refused("web.fetch", {"url": f"{base}/r/3"}, "too-many-redirects")
    assert (result.details or {})["limit"] == 2


def test_redirect_loop_and_bad_scheme_are_refused(base: str) -> None:
    result = refused("web.fetch", {"url": f"{base}/loop-a"}, "redirect-loop")
    assert "loop-a" in result.error
    refused("web.fetch", {"url": f"{base}/to-file"}, "bad-scheme")
    refused("web.fetch", {"url": "ftp://example.org/x"}, "bad-scheme", code="invalid-input")
    refused("web.fetch", {"url": "not a url"}, "bad-scheme", code="invalid-input")


def test_unresolvable_host_is_a_structured_failure(base: str) -> None:
    result = run("web.fetch", {"url": "http://no-such-host.invalid/"}, deadline_ms=3000)
    assert result.code == "failed", (result.code, result.error)
    assert (result.details or {}).get("reason") in ("connect-error", "timeout"), result.details


def test_slow_endpoint_past_the_deadline(base: str) -> None:
    t0 = time.monotonic()
    result = run("web.fetch", {"url": f"{base}/slow"}, deadline_ms=800)
    assert result.code == "failed" and (result.details or {})["reason"] == "timeout"
    assert time.monotonic() - t0 < 2
    app.config = {"allowPrivate": True, "timeoutMs": 300}
    refused("web.fetch", {"url": f"{base}/slow"}, "timeout")


def test_byte_limits_stop_the_stream(base: str) -> None:
    result = refused("web.fetch", {"url": f"{base}/huge", "maxBytes": 1 << 20}, "too-large")
    assert (result.details or {})["limit"] == 1 << 20
    result = refused("web.fetch", {"url": f"{base}/page", "maxBytes": 100}, "too-large")
    assert (result.details or {})["declared"] > 100  # refused on Content-Length, nothing read


# SSRF -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("host", "address", "category"),
    [
        ("127.0.0.1", "127.0.0.1", "loopback"),
        ("[::1]", "::1", "loopback"),
        ("[::ffff:127.0.0.1]", "::ffff:127.0.0.1", "loopback"),
        ("169.254.169.254", "169.254.169.254", "link-local"),
        ("10.1.2.3", "10.1.2.3", "private"),
        ("0.0.0.0", "0.0.0.0", "unspecified"),
        ("[ff02::1]", "ff02::1", "multicast"),
    ],
)
def test_default_policy_refuses_private_destinations(
    base: str, host: str, address: str, category: str
) -> None:
    app.config = {}
    port = base.rsplit(":", 1)[1]
    result = refused(
        "web.fetch",
        {"url": f"http://{host}:{port}/page"},
        "destination-refused",
        "destination-refused",
    )
    details = result.details or {}
    assert (details["address"], details["category"]) == (address, category)
    assert address in result.error


def test_hostname_resolving_to_loopback_is_refused(base: str) -> None:
    app.config = {}
    port = base.rsplit(":", 1)[1]
    result = refused(
        "web.fetch",
        {"url": f"http://localhost:{port}/page"},
        "destination-refused",
        "destination-refused",
    )
    details = result.details or {}
    assert details["host"] == "localhost" and details["category"] == "loopback"


def test_redirect_from_allowed_host_to_private_is_refused(base: str) -> None:
    port = base.rsplit(":", 1)[1]
    app.config = {"allowHosts": ["localhost"]}
    assert ok("web.fetch", {"url": f"http://localhost:{port}/page"})["status"] == 200
    url = f"http://localhost:{port}/to-private"
    result = refused("web.fetch", {"url": url}, "destination-refused", "destination-refused")
    assert (result.details or {})["address"] == "127.0.0.1"
    app.config = {"allowHosts": ["127.0.0.0/8"]}
    assert ok("web.fetch", {"url": f"{base}/page"})["status"] == 200


def test_destination_refused_is_its_own_error_code(base: str) -> None:
    app.config = {}
    assert run("web.fetch", {"url": f"{base}/page"}).code == "destination-refused"


def test_policy_classifies_mapped_and_global_addresses() -> None:
    assert classify(ipaddress.ip_address("::ffff:10.0.0.1")) == "private"
    assert classify(ipaddress.ip_address("fe80::1")) == "link-local"
    assert classify(ipaddress.ip_address("fd00::1")) == "private"
    assert classify(ipaddress.ip_address("100.64.0.1")) == "non-global"
    assert classify(ipaddress.ip_address("93.184.215.14")) is None
    assert classify(ipaddress.ip_address("2606:4700::1111")) is None
    # 6to4 of 127.0.0.1 was "global" here: judged by the IPv4 address inside, as NAT64 is.
    assert classify(ipaddress.ip_address("2002:7f00:1::")) == "loopback"
    assert classify(ipaddress.ip_address("64:ff9b::a9fe:a9fe")) == "link-local"
    assert classify(ipaddress.ip_address("64:ff9b::5db8:d70e")) is None
    policy = policy_from_config({"allowHosts": ["*.corp.example", "192.168.0.0/16"]})
    assert policy.refusal("git.corp.example", ["10.0.0.5"]) is None
    assert policy.refusal("x.example", ["192.168.3.4"]) is None
    assert policy.refusal("x.example", ["93.184.215.14", "10.0.0.5"]) == ("10.0.0.5", "private")


# download -----------------------------------------------------------------------------------


def test_download_streams_to_an_atomic_file(base: str) -> None:
    data = ok("web.download", {"url": f"{base}/blob", "path": "dl/blob.bin"})
    body = bytes(range(256)) * 4096
    target = Path(app.project_dir, "dl", "blob.bin")
    assert target.read_bytes() == body
    assert data["sha256"] == hashlib.sha256(body).hexdigest() and data["bytes"] == len(body)
    assert data["contentType"] == "application/octet-stream" and data["path"] == "dl/blob.bin"
    refused(
        "web.download", {"url": f"{base}/blob", "path": "dl/blob.bin"}, "exists", "invalid-input"
    )
    app.config = {"allowPrivate": True, "maxDownloadBytes": 1 << 20}
    refused("web.download", {"url": f"{base}/huge", "path": "big.bin"}, "too-large")
    refused(
        "web.download", {"url": f"{base}/blob", "path": "../x"}, "parent-traversal", "invalid-input"
    )
    assert sorted(p.name for p in Path(app.project_dir).rglob("*")) == ["blob.bin", "dl"]


# search -------------------------------------------------------------------------------------


def provider(base: str, path: str = "/search") -> dict[str, Any]:
    return {"name": "fake", "url": f"{base}{path}", "resultsPath": "data.items"}


def test_search_through_a_provider(base: str) -> None:
    app.config = {"providers": [provider(base)]}  # the provider's host is allowed implicitly
    data = ok("web.search", {"query": "tides", "limit": 3})
    assert [r["title"] for r in data["results"]] == [
        "tides result 0",
        "tides result 1",
        "tides result 2",
    ]
    assert data["results"][0] == {
        "title": "tides result 0",
        "url": "https://r0.example/",
        "snippet": "s0",
    }


def test_search_by_post_with_headers(base: str) -> None:
    post = {"name": "p", "url": f"{base}/search-post", "method": "POST", "headers": {"X-Key": "k1"}}
    app.config = {"providers": [provider(base), post]}
    data = ok("web.search", {"query": "moon", "limit": 2, "provider": "p"})
    assert data["provider"] == "p" and [r["title"] for r in data["results"]] == ["moon", "moon"]
    app.config = {"providers": [{**post, "headers": {}}]}
    result = refused("web.search", {"query": "moon"}, "http-error")
    assert (result.details or {})["status"] == 403
    refused("web.search", {"query": "x", "provider": "nope"}, "unknown-provider", "invalid-input")


def test_search_provider_errors(base: str) -> None:
    app.config = {"providers": [provider(base, "/search-500")]}
    result = refused("web.search", {"query": "x"}, "http-error")
    assert (result.details or {})["status"] == 500 and "quota exhausted" in result.error
    app.config = {"providers": [provider(base, "/search-bad")]}
    result = refused("web.search", {"query": "x"}, "bad-answer")
    assert "$.data.items[1].title" in result.error


def test_search_without_providers_is_unavailable(base: str) -> None:
    app.config = {}
    result = run("web.search", {"query": "x"})
    assert result.code == "unavailable" and "config.providers" in result.error
    health = app.health_check(app)
    assert set(health) == {"web.search"} and health["web.search"].status == "unavailable"
    app.config = {"providers": [provider(base)]}
    assert app.health_check(app) == {}
