"""Real headless Chromium and a loopback page server for the browser sidecar tests.

Chromium is started with ``--remote-debugging-port=0`` and a temporary ``--user-data-dir``; the
port is read from ``DevToolsActivePort``. Background networking is off (the test machine has
no internet). Without Chromium the tests skip locally; with ``CI=true`` they fail instead.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import psutil
import pytest
import trio

from tests.conftest import REPO, running_host, wait_for

CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "chrome")
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=800,600",
]

INDEX = """<!doctype html>
<html><head><title>Toolhost Test Page</title>
<style>
  html, body { margin: 0; background: #ffffff; }
  #red { position: absolute; left: 0; top: 0; width: 100px; height: 100px; background: #ff0000; }
  #blue { position: absolute; left: 200px; top: 0; width: 100px; height: 100px;
          background: #0000ff; }
  #controls { position: absolute; left: 0; top: 150px; }
  #tall { position: absolute; left: 0; top: 1500px; width: 50px; height: 50px;
          background: #00ff00; }
</style></head>
<body>
<div id="red"></div><div id="blue"></div>
<div id="controls">
  <button id="go" onclick="document.getElementById('out').textContent = 'clicked ' + (++window.n)">
    Press me</button>
  <p id="out">not clicked</p>
  <form action="/submit" method="get">
    <input id="q" name="q" aria-label="Search words">
  </form>
</div>
<div id="tall"></div>
<script>window.n = 0;</script>
</body></html>
"""

SECOND = "<!doctype html><html><head><title>Second Tab</title></head><body>two</body></html>"


class PageServer:
    """A threaded loopback HTTP server: ``/``, ``/second``, ``/submit?q=``, ``/slow``."""

    def __init__(self) -> None:
        self.received: list[str] = []
        self.slow_started = threading.Event()
        self.release = threading.Event()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                parts = urlsplit(self.path)
                if parts.path == "/submit":
                    server.received.extend(parse_qs(parts.query).get("q", []))
                    self._send("<html><head><title>Thanks</title></head><body>ok</body></html>")
                elif parts.path == "/second":
                    self._send(SECOND)
                elif parts.path == "/slow":
                    server.slow_started.set()
                    server.release.wait(30)
                    self._send("<html><head><title>Slow</title></head></html>")
                elif parts.path in ("/", "/index.html"):
                    self._send(INDEX)
                else:
                    self.send_error(404)

            def _send(self, body: str) -> None:
                data = body.encode()
                try:
                    self.send_response(200)
                    self.send_header("Content-Type", "text/html; charset=utf-8")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except OSError:
                    pass  # the browser gave up (a cancelled navigation, a killed browser)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def url(self, path: str = "/") -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def close(self) -> None:
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()


class Chromium:
    """One headless Chromium process with its DevTools port."""

    def __init__(self, binary: str) -> None:
        self.binary = binary
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0
        self.profile: str | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _spawn(self) -> Path:
        self.profile = tempfile.mkdtemp(prefix="toolhost-chromium-")
        args = [
            self.binary,
            *FLAGS,
            f"--user-data-dir={self.profile}",
            f"--remote-debugging-port={self.port}",
            "about:blank",
        ]
        self.proc = subprocess.Popen(
            args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
        )
        return Path(self.profile) / "DevToolsActivePort"

    def _read_port(self, active: Path) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise RuntimeError(f"chromium exited with status {self.proc.returncode}")
        try:
            first = active.read_text().splitlines()[0]
        except (FileNotFoundError, IndexError):
            return False
        self.port = int(first)
        return True

    def start(self, timeout: float = 30) -> None:
        """Start (blocking); the port is the previous one when restarting, else a free one."""
        active = self._spawn()
        limit = time.monotonic() + timeout
        while not self._read_port(active):
            if time.monotonic() > limit:
                raise RuntimeError("chromium wrote no DevToolsActivePort")
            time.sleep(0.05)

    async def astart(self, timeout: float = 30) -> None:
        """Start again from a Trio test (same port, fresh profile).

        With a fixed port Chromium writes no ``DevToolsActivePort``: wait until it listens.
        """
        self._spawn()
        assert self.proc is not None
        with trio.fail_after(timeout):
            while True:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"chromium exited with status {self.proc.returncode}")
                try:
                    stream = await trio.open_tcp_stream("127.0.0.1", self.port)
                except OSError:
                    await trio.sleep(0.05)
                    continue
                await stream.aclose()
                return

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        _reap_adopted_crashpad()
        if self.profile:
            shutil.rmtree(self.profile, ignore_errors=True)
            self.profile = None


def _reap_adopted_crashpad() -> None:
    """Chromium's crashpad handlers double-fork out of its process group; while a test host
    (a child subreaper) runs in this process they are adopted by it. End and reap them here so
    they outlive neither their browser nor the test as zombies."""
    for child in psutil.Process().children():
        with contextlib.suppress(psutil.Error, ChildProcessError):
            if child.name().startswith("chrome_crashpad"):
                child.kill()
                os.waitpid(child.pid, 0)


def find_chromium() -> str:
    for name in CANDIDATES:
        path = shutil.which(name)
        if path:
            return path
    reason = "Chromium is not installed (apt-get install chromium) - browser tests need it"
    if os.environ.get("CI") == "true":
        pytest.fail(reason + "; CI must install it (.ci/run)")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def pages() -> Iterator[PageServer]:
    server = PageServer()
    yield server
    server.close()


@pytest.fixture(scope="session")
def chromium() -> Iterator[Chromium]:
    """One Chromium shared by the tests that do not kill it."""
    browser = Chromium(find_chromium())
    browser.start()
    yield browser
    browser.kill()


@pytest.fixture
def own_chromium() -> Iterator[Chromium]:
    """A Chromium for this test alone (it may be killed and restarted)."""
    browser = Chromium(find_chromium())
    browser.start()
    yield browser
    browser.kill()


def browser_entry(endpoint: str, **extra: Any) -> dict[str, Any]:
    """The registry entry `toolhost init --add browser` writes, with the test's endpoint."""
    from supervisor.cli.init import bundled_registry

    entry = dict(bundled_registry(["browser"])["sidecars"]["browser"])
    entry["config"] = {"endpoint": endpoint}
    # Confined, the sidecar reaches only the loopback ports it is granted: an endpoint on
    # another port than the family's 9222 is granted with it (docs/confinement.md).
    port = urlsplit(endpoint).port
    if port is not None:
        entry["confine"] = {"network": {"loopback": [port]}}
    entry["restart"] = {"backoffMs": 20, "maxBackoffMs": 200}
    entry.update(extra)
    return entry


@asynccontextmanager
async def browser_host(app: Path, endpoint: str, **extra: Any) -> AsyncIterator[Any]:
    """A running toolhost serving the browser sidecar, and a client on its kernel socket."""
    from supervisor.client import open_client
    from tests.kernel import served

    async with (
        running_host(
            app,
            {"browser": browser_entry(endpoint, **extra)},
            manifest_dirs=[str(REPO / "manifests")],
        ) as host,
        served(host, app) as srv,
        open_client(srv.sock) as client,
    ):
        client.host = host
        yield client


async def wait_effective(client: Any, tool: str, want: str, timeout: float = 20) -> None:
    host = client.host
    await wait_for(
        host,
        lambda: (d := host.catalog.get(tool)) is not None and d.stability.effective == want,
        timeout,
        what=f"{tool} {want}",
    )
