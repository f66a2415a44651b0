"""The egress proxy's HTTP side (``host.egress``): the request head parsed, the destination it
asks for, the request forwarded to an origin, and the proxy's own answers (refusals)."""

from __future__ import annotations

import socket as stdsocket

import trio

from supervisor.host import egress_io
from supervisor.policy.egress import sanitize_host


class Refusal(Exception):
    """A request the proxy answers itself: ``status``, a one-line ``reason``, the ``rule``."""

    def __init__(self, status: int, reason: str, rule: str = "") -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason
        self.rule = rule


REASONS = {
    200: b"Connection established",
    400: b"Bad Request",
    403: b"Forbidden",
    405: b"Method Not Allowed",
    407: b"Proxy Authentication Required",
    408: b"Request Timeout",
    431: b"Request Header Fields Too Large",
    502: b"Bad Gateway",
    503: b"Service Unavailable",
    504: b"Gateway Timeout",
}
ESTABLISHED = b"HTTP/1.1 200 Connection established\r\n\r\n"
LINGER_S = 1.0
LINGER_BYTES = 1 << 20
HOP = {b"proxy-authorization", b"proxy-connection", b"connection", b"keep-alive", b"host"}


def parse_head(head: bytes) -> tuple[str, str, list[tuple[bytes, bytes]]]:
    """(method, target, headers with lower-case names) of a request head.

    Raises:
        Refusal: 400, not a well-formed HTTP/1 request.
    """
    lines = head.split(b"\r\n")
    parts = lines[0].split(b" ")
    if len(parts) != 3 or not parts[2].startswith(b"HTTP/1."):
        raise Refusal(400, "not an HTTP/1 proxy request")
    try:
        method, target = parts[0].decode("ascii"), parts[1].decode("ascii")
    except UnicodeDecodeError:
        raise Refusal(400, "the request line is not ASCII") from None
    headers: list[tuple[bytes, bytes]] = []
    for line in lines[1:]:
        name, sep, value = line.partition(b":")
        if not sep or not name or name != name.strip() or line[:1] in b" \t":
            raise Refusal(400, "a malformed header line")
        headers.append((name.lower(), value.strip()))
    names = {k for k, _ in headers}
    if b"content-length" in names and b"transfer-encoding" in names:
        raise Refusal(400, "both Content-Length and Transfer-Encoding")
    return method, target, headers


def split_authority(authority: str, default_port: int) -> tuple[str, str]:
    """(host, port text) of ``host[:port]`` or ``[v6][:port]``."""
    if authority.startswith("["):
        end = authority.find("]")
        if end < 0:
            return "", ""
        after = authority[end + 1 :]
        if after and not after.startswith(":"):
            return "", ""
        return authority[1:end], after[1:] if after else str(default_port)
    host, sep, port_text = authority.partition(":")
    return host, port_text if sep else str(default_port)


def target_of(method: str, target: str) -> tuple[str, int]:
    """(host, port) a request asks for.

    Raises:
        Refusal: 400, not a destination (or ``https://`` without ``CONNECT``).
    """
    if method == "CONNECT":
        host, port_text = split_authority(target, 0)
    elif target.lower().startswith("http://"):
        authority = target[7:].split("/", 1)[0].split("?", 1)[0]
        if "@" in authority:
            raise Refusal(400, "credentials in the URL are not forwarded")
        host, port_text = split_authority(authority, 80)
    elif target.lower().startswith("https://"):
        raise Refusal(400, "an https:// URL goes through CONNECT (set HTTPS_PROXY)")
    else:
        raise Refusal(400, "a proxy request needs an absolute http:// URL or CONNECT host:port")
    name = sanitize_host(host) if host else None
    if name is None or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise Refusal(400, f"not a destination: {target[:200]!r}")
    return name, int(port_text)


def origin_request(
    method: str, target: str, host: str, port: int, headers: list[tuple[bytes, bytes]]
) -> bytes:
    """An absolute-form request rewritten for the origin: ``Host`` the checked name, no
    hop-by-hop or ``Proxy-*`` headers, ``Connection: close``."""
    rest = target[7:]
    slash = rest.find("/")
    path = rest[slash:] if slash >= 0 else "/"
    authority = host if port == 80 else f"{host}:{port}"
    if ":" in host:
        authority = f"[{host}]" if port == 80 else f"[{host}]:{port}"
    lines = [f"{method} {path} HTTP/1.1".encode(), b"Host: " + authority.encode()]
    lines += [k + b": " + v for k, v in headers if k not in HOP]
    lines.append(b"Connection: close")
    return b"\r\n".join(lines) + b"\r\n\r\n"


async def reply(stream: stdsocket.socket, status: int, reason: str, *, auth: bool = False) -> None:
    """The proxy's own answer (a refusal, a timeout) with ``reason`` as its one-line body."""
    body = reason.replace("\r", " ").replace("\n", " ").encode() + b"\n"
    head = [
        b"HTTP/1.1 %d %s" % (status, REASONS.get(status, b"Error")),
        b"Content-Type: text/plain; charset=utf-8",
        b"Content-Length: %d" % len(body),
        b"Connection: close",
    ]
    if auth:
        head.append(b'Proxy-Authenticate: Basic realm="toolhost"')
    try:
        await egress_io.send_all(stream, b"\r\n".join(head) + b"\r\n\r\n" + body)
        # Read (and drop) what the client still sends for a moment, so closing with unread
        # bytes does not reset the connection before the client reads the answer.
        stream.shutdown(stdsocket.SHUT_WR)
        with trio.move_on_after(LINGER_S):
            dropped = 0
            while dropped < LINGER_BYTES and (data := await egress_io.recv(stream, 65536)):
                dropped += len(data)
    except OSError:
        pass
