"""The web console's side of the gateway: static files at ``/`` and the browser's way in.

# Strategy: the console is three static files shipped in ``supervisor/console/`` (HTML, CSS,
# plain JavaScript), read once, each with a strong ETag (a hash of its bytes), answered on the
# gateway's HTTP port with a Content-Security-Policy that lets the page talk to its own origin
# only. The page holds no data: everything it shows comes over the authenticated WebSocket as
# kernel-protocol requests and events. A browser cannot set ``Authorization`` on a WebSocket, so
# the page offers the token as a ``Sec-WebSocket-Protocol`` value (``toolhost.bearer.<token>``
# next to ``toolhost.v1``; the server answers ``toolhost.v1``, never echoing the token). The
# handshake checks ``Origin`` (a browser's request must come from the gateway's own origin) and,
# on a loopback listener, that ``Host`` names loopback (no DNS rebinding). See docs/console.md
# and docs/security.md.
"""

from __future__ import annotations

import hashlib
import hmac
from importlib import resources
from typing import NamedTuple
from urllib.parse import urlsplit

from supervisor.server.gateway_http import Page

SUBPROTOCOL = "toolhost.v1"
BEARER_PREFIX = "toolhost.bearer."

_FILES = {
    "/": ("index.html", b"text/html; charset=utf-8"),
    "/index.html": ("index.html", b"text/html; charset=utf-8"),
    "/console.css": ("console.css", b"text/css; charset=utf-8"),
    "/console.js": ("console.js", b"text/javascript; charset=utf-8"),
}

CSP = (
    b"default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
    b"img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
SECURITY_HEADERS = [
    (b"content-security-policy", CSP),
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"no-referrer"),
    (b"cross-origin-opener-policy", b"same-origin"),
    (b"cross-origin-resource-policy", b"same-origin"),
]


class Asset(NamedTuple):
    body: bytes
    content_type: bytes
    etag: bytes


_assets: dict[str, Asset] | None = None


def assets() -> dict[str, Asset]:
    """The console's files by URL path (read from the package once)."""
    global _assets
    if _assets is None:
        folder = resources.files("supervisor.console")
        loaded: dict[str, Asset] = {}
        for path, (name, ctype) in _FILES.items():
            body = folder.joinpath(name).read_bytes()
            etag = b'"' + hashlib.sha256(body).hexdigest()[:32].encode() + b'"'
            loaded[path] = Asset(body, ctype, etag)
        _assets = loaded
    return _assets


def header(head: bytes, name: bytes) -> bytes | None:
    """The value of header ``name`` (lower case) in a raw request head, or None."""
    for line in head.split(b"\r\n")[1:]:
        if not line:
            break
        key, sep, value = line.partition(b":")
        if sep and key.strip().lower() == name:
            return value.strip()
    return None


def host_is_loopback(host: str | None) -> bool:
    """Whether a ``Host`` header names a loopback address (``localhost``, 127/8, ``[::1]``)."""
    if not host:
        return False
    name = urlsplit("//" + host).hostname or ""
    if name == "localhost" or name == "::1":
        return True
    parts = name.split(".")
    return len(parts) == 4 and parts[0] == "127" and all(p.isdigit() for p in parts)


def same_origin(origin: str, host: str | None) -> bool:
    """Whether a browser's ``Origin`` is the gateway's own (``http(s)://<Host>``)."""
    if not host:
        return False
    return origin in (f"http://{host}", f"https://{host}")


def serve_page(method: str, path: str, head: bytes, *, loopback: bool) -> Page | None:
    """The console's answer to a plain ``GET``/``HEAD``, or None for a path it does not own."""
    asset = assets().get(path)
    if asset is None:
        return None
    if loopback:
        host = header(head, b"host")
        if not host_is_loopback(host.decode("latin-1") if host is not None else None):
            return Page(
                403, [(b"content-type", b"text/plain")], b"forbidden: Host is not loopback\n"
            )
    headers = [
        (b"content-type", asset.content_type),
        (b"etag", asset.etag),
        (b"cache-control", b"no-cache"),
        *SECURITY_HEADERS,
    ]
    match = header(head, b"if-none-match")
    if match is not None and any(
        hmac.compare_digest(tag.strip().removeprefix(b"W/"), asset.etag)
        for tag in match.split(b",")
    ):
        return Page(304, headers, b"", head_only=True)
    return Page(200, headers, asset.body, head_only=method == "HEAD")


def console_off(path: str) -> Page | None:
    """What ``/`` answers when ``host.console`` is false."""
    if path not in _FILES:
        return None
    return Page(
        404, [(b"content-type", b"text/plain")], b"not found: the console is off (host.console)\n"
    )


def bearer_from_subprotocols(proposed: tuple[str, ...], token: str) -> bool:
    """Whether the browser offered ``toolhost.bearer.<token>`` (compared in constant time)."""
    expected = (BEARER_PREFIX + token).encode()
    return any(
        p.startswith(BEARER_PREFIX) and hmac.compare_digest(p.encode(), expected) for p in proposed
    )
