"""The pure parts of the MCP Streamable HTTP transport, client side (MCP 2025-11-25, 2026-07-28).

# Strategy: the JSON-RPC layer stays :class:`supervisor.protocols.mcp.McpConnection`; this
# module only knows HTTP-shaped things: what a valid endpoint URL is (:func:`parse_url`,
# :func:`url_problem`), the headers of a POST/DELETE (:func:`request_headers`; in the stateless
# era with the routing headers the connection gives, ``Mcp-Method``/``Mcp-Name``, their values
# coded by :func:`encode_header_value`), and how the body of an answer becomes JSON-RPC lines
# for the connection: a JSON body as one line (:func:`json_line`) or an SSE stream event by
# event (:class:`SseParser`). No sockets, no clock, no trio: the worker in
# ``workers/mcp_http.py`` does the IO.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Callable
from urllib.parse import urlsplit

import msgspec

SESSION_HEADER = "mcp-session-id"
VERSION_HEADER = "mcp-protocol-version"
ACCEPT = "application/json, text/event-stream"
_RESERVED = frozenset(
    ("host", "content-length", "content-type", "accept", "connection", "transfer-encoding")
) | {SESSION_HEADER, VERSION_HEADER}


VAULT_REF = re.compile(r"\$\{vault:([^}]*)\}")
"""``${vault:KEY}`` in a ``config.headers`` value: the vault's value of KEY (PROTOCOL 3.5)."""


class Endpoint(msgspec.Struct, frozen=True, kw_only=True):
    """Where a remote MCP server listens."""

    url: str
    tls: bool
    host: str
    port: int
    target: str
    """The request target: path and query (``/mcp`` when the URL has no path)."""

    @property
    def host_header(self) -> str:
        default = 443 if self.tls else 80
        host = f"[{self.host}]" if ":" in self.host else self.host
        return host if self.port == default else f"{host}:{self.port}"


class BadUrl(ValueError):
    """The URL cannot name a Streamable HTTP endpoint (the message says why)."""


def parse_url(url: str) -> Endpoint:
    """The endpoint of an ``http://`` or ``https://`` URL.

    Raises:
        BadUrl: Another scheme, no host, a bad port, credentials or a fragment in the URL.
    """
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise BadUrl(f"not a valid URL: {exc}") from exc
    if parts.scheme not in ("http", "https"):
        scheme = parts.scheme or "none"
        raise BadUrl(f"{url!r}: the scheme must be http or https (got {scheme})")
    if not parts.hostname:
        raise BadUrl(f"{url!r}: no host")
    if parts.username is not None or parts.password is not None:
        raise BadUrl(f"{url!r}: put credentials in config.headers, not in the URL")
    if parts.fragment:
        raise BadUrl(f"{url!r}: a URL with a #fragment")
    if any(c.isspace() for c in url):
        raise BadUrl(f"{url!r}: whitespace in the URL")
    tls = parts.scheme == "https"
    target = parts.path or "/"
    if parts.query:
        target = f"{target}?{parts.query}"
    return Endpoint(
        url=url,
        tls=tls,
        host=parts.hostname,
        port=port if port is not None else (443 if tls else 80),
        target=target,
    )


def url_problem(url: str) -> str | None:
    """Why ``url`` is not a usable endpoint (None when it is)."""
    try:
        parse_url(url)
    except BadUrl as exc:
        return str(exc)
    return None


def extra_headers(config: dict[str, object]) -> list[tuple[str, str]]:
    """The ``headers`` of a sidecar's ``config`` (e.g. ``Authorization``), minus the ones the
    transport sets itself."""
    headers = config.get("headers")
    if not isinstance(headers, dict):
        return []
    return [
        (str(k), v)
        for k, v in headers.items()
        if isinstance(v, str) and str(k).lower() not in _RESERVED
    ]


def header_problems(config: dict[str, object], declared: set[str]) -> list[tuple[str, str]]:
    """``(header, problem)`` for every ``config.headers`` value that is not a string, holds a
    line break, or names a vault key not in ``declared`` (the entry's ``vault`` list)."""
    headers = config.get("headers")
    if headers is None:
        return []
    if not isinstance(headers, dict):
        return [("", "expected an object of strings")]
    out: list[tuple[str, str]] = []
    for name, value in headers.items():
        if not isinstance(value, str):
            out.append((name, "expected a string"))
        elif any(c in value for c in "\r\n\0"):
            out.append((name, "a header value cannot hold a line break or NUL"))
        else:
            for key in VAULT_REF.findall(value):
                if key not in declared:
                    out.append((name, f"vault key {key!r} is not declared in the entry's vault"))
    return out


def resolve_headers(
    config: dict[str, object], lookup: Callable[[str], str | None]
) -> tuple[dict[str, object], str | None]:
    """``config`` with every ``${vault:KEY}`` in ``headers`` replaced by ``lookup(KEY)``.

    Returns:
        The new config and None, or the config without ``headers`` and why a value is missing
        (``lookup`` returned None, raised ValueError, or the value holds a line break). The
        message never contains a secret.
    """
    headers = config.get("headers")
    if not isinstance(headers, dict):
        return config, None
    resolved: dict[str, object] = {}
    for name, value in headers.items():
        if not isinstance(value, str):
            continue
        problem: list[str] = []

        def one(match: re.Match[str], name: str = name, problem: list[str] = problem) -> str:
            key = match.group(1)
            try:
                secret = lookup(key)
            except ValueError as exc:
                problem.append(f"config.headers.{name}: vault key {key!r}: {exc}")
                return ""
            if secret is None:
                problem.append(
                    f"config.headers.{name}: vault key {key!r} is not set "
                    f"(`toolhost vault set {key}`)"
                )
                return ""
            if any(c in secret for c in "\r\n\0"):
                problem.append(f"config.headers.{name}: vault key {key!r} holds a line break")
                return ""
            return secret

        text = VAULT_REF.sub(one, value)
        if problem:
            rest = {k: v for k, v in config.items() if k != "headers"}
            return rest, problem[0]
        resolved[name] = text
    return {**config, "headers": resolved}, None


def request_headers(
    endpoint: Endpoint,
    *,
    session: str | None,
    version: str | None,
    extra: list[tuple[str, str]],
    body: bytes | None,
    routing: list[tuple[str, str]] | None = None,
) -> list[tuple[str, str]]:
    """The headers of a POST (``body`` given) or DELETE (``body`` None) to ``endpoint``;
    ``routing`` (:meth:`McpConnection.http_headers`, the stateless era) carries its own
    ``MCP-Protocol-Version`` and replaces ``version``."""
    headers = [("Host", endpoint.host_header), ("Accept", ACCEPT), ("Connection", "close")]
    if body is not None:
        headers += [("Content-Type", "application/json"), ("Content-Length", str(len(body)))]
    if session is not None:
        headers.append(("Mcp-Session-Id", session))
    if routing:
        headers += routing
    elif version is not None:
        headers.append(("MCP-Protocol-Version", version))
    return headers + extra


_HEADER_SAFE = re.compile(r"[\x20-\x7e]*")
_WRAPPED = re.compile(r"=\?base64\?(.*)\?=")


def encode_header_value(value: str) -> str:
    """A value for an MCP routing header (``Mcp-Name``): verbatim when it is printable ASCII
    without edge spaces, else ``=?base64?...?=`` so the exact text survives HTTP."""
    if _HEADER_SAFE.fullmatch(value) and value == value.strip() and not _WRAPPED.fullmatch(value):
        return value
    return f"=?base64?{base64.b64encode(value.encode('utf-8')).decode('ascii')}?="


def decode_header_value(value: str | None) -> str | None:
    """The inverse of :func:`encode_header_value` (None for a malformed wrapper, so a corrupt
    header never matches a body by accident)."""
    if value is None:
        return None
    wrapped = _WRAPPED.fullmatch(value)
    if wrapped is None:
        return value
    payload = wrapped.group(1)
    try:
        raw = base64.b64decode(payload, validate=True)
        if base64.b64encode(raw).decode("ascii") != payload:
            return None
        return raw.decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return None


def json_line(body: bytes) -> bytes:
    """A JSON body as one line for :meth:`McpConnection.feed` (raw newlines in JSON can only
    be whitespace between tokens, so they become spaces)."""
    return body.replace(b"\r", b" ").replace(b"\n", b" ") + b"\n"


class _ErrorAnswer(msgspec.Struct):
    id: int | str | None = None
    error: dict[str, object] | None = None


def answers(body: bytes, rid: int) -> bool:
    """Whether an HTTP error's body is the JSON-RPC error answering request ``rid`` (the
    stateless era answers a refused request so, e.g. -32022 with status 400)."""
    try:
        msg = msgspec.json.decode(body, type=_ErrorAnswer)
    except (msgspec.ValidationError, msgspec.DecodeError):
        return False
    return msg.id == rid and msg.error is not None


class SseParser:
    """Server-sent events in, the ``data`` of each ``message`` event out (as JSON lines).

    Args:
        max_event: Longest event accepted, in bytes (the connection's line limit).
    """

    def __init__(self, max_event: int) -> None:
        self._buf = b""
        self._data: list[bytes] = []
        self._event = b""
        self._size = 0
        self._max = max_event

    def feed(self, chunk: bytes) -> list[bytes]:
        """JSON lines of every event completed by ``chunk``.

        Raises:
            ValueError: An event longer than ``max_event``.
        """
        self._buf += chunk
        out: list[bytes] = []
        while True:
            nl = self._buf.find(b"\n")
            if nl < 0:
                if len(self._buf) > self._max:
                    raise ValueError(f"an SSE line longer than {self._max} bytes")
                return out
            line, self._buf = self._buf[:nl], self._buf[nl + 1 :]
            if line.endswith(b"\r"):
                line = line[:-1]
            if not line:
                if self._data and self._event in (b"", b"message"):
                    out.append(json_line(b"\n".join(self._data)))
                self._data, self._event, self._size = [], b"", 0
                continue
            if line.startswith(b":"):
                continue
            name, _, value = line.partition(b":")
            if value.startswith(b" "):
                value = value[1:]
            if name == b"data":
                self._size += len(value)
                if self._size > self._max:
                    raise ValueError(f"an SSE event longer than {self._max} bytes")
                self._data.append(value)
            elif name == b"event":
                self._event = value
