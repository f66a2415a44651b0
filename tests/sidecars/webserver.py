"""A loopback HTTP server of the tests playing web pages, redirects, slow and huge bodies, and a
search provider (ok, 500, malformed). Runs in a thread; bodies are streamed, never built whole."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

ARTICLE = (
    "<html><head><title>Lighthouse keeping</title></head><body>"
    "<nav><a href='/'>Home</a> | <a href='/about'>About</a></nav>"
    "<article><h1>Lighthouse keeping</h1>"
    "<p>The keeper climbed one hundred and twelve steps every evening to light the lamp. "
    "The lens turned all night and its beam reached twenty nautical miles over the sea.</p>"
    "<p>In winter storms the keeper wrote the log by hand and trimmed the wick every four "
    "hours, so that ships passing the reef could find their way to the harbour safely.</p>"
    "<p>See also <a href='https://example.org/lamps'>the history of lamps</a>.</p>"
    "</article><footer>Copyright cookie banner footer text</footer></body></html>"
)
MAIN_WORDS = ("keeper climbed one hundred and twelve steps", "trimmed the wick")
CHUNK = b"x" * 65536


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: Any) -> None:
        pass

    def _send(self, status: int, body: bytes, ctype: str = "text/html; charset=utf-8") -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        try:
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):
            pass

    def _redirect(self, location: str) -> None:
        self.send_response(302)
        self.send_header("Location", location)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def _stream(self, total: int, delay: float = 0.0) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        sent = 0
        try:
            while sent < total:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(CHUNK), CHUNK))
                sent += len(CHUNK)
                if delay:
                    time.sleep(delay)
            self.wfile.write(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path == "/search-post" and self.headers.get("X-Key") == "k1":
            items = [{"title": body["query"], "url": "https://p.example/", "snippet": ""}]
            self._send(200, json.dumps(items * body["limit"]).encode(), "application/json")
        else:
            self._send(403, b"forbidden", "text/plain")

    def do_GET(self) -> None:
        url = urlparse(self.path)
        query = parse_qs(url.query)
        port = self.server.server_address[1]
        path = url.path
        if path == "/page":
            self._send(200, ARTICLE.encode())
        elif path == "/big-page":
            size = int(query.get("size", ["102400"])[0])
            para = "<p>" + "lorem ipsum dolor sit amet " * 20 + "</p>"
            body = ("<html><body><article>" + para * (size // len(para) + 1))[:size]
            self._send(200, body.encode())
        elif path == "/plain":
            self._send(200, b"just text", "text/plain")
        elif path == "/image":
            self._send(200, b"\x89PNG....", "image/png")
        elif path.startswith("/r/"):
            n = int(path.rsplit("/", 1)[1])
            self._redirect(f"/r/{n - 1}" if n > 1 else "/page")
        elif path == "/loop-a":
            self._redirect("/loop-b")
        elif path == "/loop-b":
            self._redirect("/loop-a")
        elif path == "/to-private":
            self._redirect(f"http://127.0.0.1:{port}/page")
        elif path == "/to-file":
            self._redirect("file:///etc/passwd")
        elif path == "/slow":
            time.sleep(5)
            self._send(200, b"late")
        elif path == "/huge":
            self._stream(200 << 20)
        elif path == "/trickle":
            self._stream(50 << 20, delay=0.02)
        elif path == "/blob":
            self._send(200, bytes(range(256)) * 4096, "application/octet-stream")
        elif path == "/search":
            q = query.get("q", [""])[0]
            items = [
                {"title": f"{q} result {i}", "url": f"https://r{i}.example/", "snippet": f"s{i}"}
                for i in range(5)
            ]
            self._send(200, json.dumps({"data": {"items": items}}).encode(), "application/json")
        elif path == "/search-500":
            self._send(500, b'{"error":"quota exhausted"}', "application/json")
        elif path == "/search-bad":
            body = {"data": {"items": [{"title": "ok", "url": "https://a/"}, {"title": 3}]}}
            self._send(200, json.dumps(body).encode(), "application/json")
        else:
            self._send(404, b"not found", "text/plain")


@contextmanager
def web_server() -> Iterator[str]:
    """Serve on 127.0.0.1; yields the base URL ``http://127.0.0.1:<port>``."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
