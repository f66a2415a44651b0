"""A ``toolhost serve`` process started for the bench, on a temporary app root.

# Strategy: the host is a separate process (as in production), started with the same interpreter
# as ``python -m supervisor serve --no-global``; its stderr is drained by a thread for the whole
# run (a host blocked on a full stderr pipe would measure the pipe, not the host). A control
# connection, separate from the measured ones, reads the catalog and the worker pids.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

from bench.clients import LineClient, unix_connect
from bench.machine import REPO


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the registry needs a concrete one)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class BenchHost:
    """Start and talk to one ``toolhost serve``.

    Args:
        sidecars: The registry's ``sidecars``.
        ws: Also open the WebSocket gateway (on a free port picked here).
        tree: The checkout whose ``supervisor`` runs (``--against`` compares two).
        python: The interpreter that runs it (the tree's own venv's for another tree).
        host: More of the registry's ``host`` settings (``confinement``, ``zygote``).

    The registry is always written here, in a temporary app root with its own socket: the bench
    never reads the operator's ``tools/`` and never binds their addresses.
    """

    def __init__(
        self,
        sidecars: dict[str, Any] | None = None,
        *,
        ws: bool = False,
        tree: Path = REPO,
        python: str = sys.executable,
        host: dict[str, Any] | None = None,
    ) -> None:
        self._tmp = tempfile.TemporaryDirectory(prefix="toolhost-bench-")
        self.tree = tree
        self.python = python
        self.root = Path(self._tmp.name)
        self.sidecars = sidecars or {}
        self.ws_port = free_port() if ws else None
        (self.root / "tools").mkdir()
        host = dict(host or {})
        self._settings = dict(host)
        self._embedded: tempfile.TemporaryDirectory[str] | None = None
        if self.ws_port is not None:
            host["ws"] = {
                "listen": f"127.0.0.1:{self.ws_port}",
                "tokenFile": ".toolhost/ws.token",
            }
        self._write_registry(self.root, host)
        self.sock_path = self.root / ".toolhost" / "host.sock"
        self.proc: subprocess.Popen[bytes] | None = None
        self.stderr_tail: deque[str] = deque(maxlen=200)
        self.spawned_at = 0.0
        self.serving_at = 0.0
        self._control: LineClient | None = None

    def _write_registry(self, root: Path, host: dict[str, Any]) -> None:
        registry = {"schemaVersion": 2, "host": host, "sidecars": self.sidecars}
        (root / "tools" / "external.tools.jsonc").write_text(json.dumps(registry, indent=2))

    @property
    def embedded_root(self) -> Path:
        """An app root of its own with the same registry (no gateway), for a ``toolhost mcp
        --embedded`` beside this host: one host per app root (``.toolhost/host.lock``)."""
        if self._embedded is None:
            self._embedded = tempfile.TemporaryDirectory(prefix="toolhost-bench-embedded-")
            root = Path(self._embedded.name)
            (root / "tools").mkdir()
            self._write_registry(root, self._settings)
        return Path(self._embedded.name)

    # lifecycle ---------------------------------------------------------------------------

    def start(self, timeout_s: float = 30.0) -> BenchHost:
        """Spawn the host and return once it logged ``toolhost serving``."""
        env = {**os.environ, "XDG_CONFIG_HOME": str(self.root / ".xdg")}
        self.spawned_at = time.perf_counter()
        self.proc = subprocess.Popen(
            [
                self.python,
                "-m",
                "supervisor",
                "serve",
                "--app-root",
                str(self.root),
                "--no-global",
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env=env,
            cwd=str(self.tree),
        )
        serving = threading.Event()
        threading.Thread(target=self._drain, args=(serving,), daemon=True).start()
        # The event is also set when stderr ends: then the host exited before serving.
        if not serving.wait(timeout_s) or not self.serving_at or self.proc.poll() is not None:
            self.stop()
            raise RuntimeError("toolhost serve did not start:\n" + "".join(self.stderr_tail))
        return self

    def _drain(self, serving: threading.Event) -> None:
        assert self.proc is not None and self.proc.stderr is not None
        for raw in self.proc.stderr:
            line = raw.decode(errors="replace")
            self.stderr_tail.append(line)
            if not serving.is_set() and "toolhost serving" in line:
                self.serving_at = time.perf_counter()
                serving.set()
        serving.set()

    def stop(self) -> None:
        """SIGTERM (graceful drain), then SIGKILL after 15 s; removes the app root (and the
        embedded one)."""
        if self._control is not None:
            self._control.close()
            self._control = None
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._tmp.cleanup()
        if self._embedded is not None:
            self._embedded.cleanup()

    def __enter__(self) -> BenchHost:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # facts -------------------------------------------------------------------------------

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    @property
    def control(self) -> LineClient:
        if self._control is None:
            self._control = LineClient(unix_connect(self.sock_path))
        return self._control

    def connect(self) -> socket.socket:
        """A new Unix socket connection for a measured client."""
        return unix_connect(self.sock_path)

    def ws_token(self) -> str:
        return (self.root / ".toolhost" / "ws.token").read_text().strip()

    def catalog(self) -> dict[str, Any]:
        result: dict[str, Any] = self.control.request("capability.catalog.get")
        return result

    def sidecar(self, sidecar: str) -> dict[str, Any]:
        for s in self.catalog()["sidecars"]:
            if s["id"] == sidecar:
                return dict(s)
        raise KeyError(sidecar)

    def worker_pids(self, sidecar: str) -> list[int]:
        return [w["pid"] for w in self.sidecar(sidecar)["workers"] if w.get("pid")]

    def wait_tools(self, tools: list[str], timeout_s: float = 60.0) -> None:
        """Block until every tool in ``tools`` is in ``tools.list`` (model-visible)."""
        deadline = time.monotonic() + timeout_s
        while True:
            names = {t["name"] for t in self.control.request("tools.list")["tools"]}
            missing = set(tools) - names
            if not missing:
                return
            if time.monotonic() > deadline or (
                self.proc is not None and self.proc.poll() is not None
            ):
                raise TimeoutError(
                    f"tools never became visible: {sorted(missing)}\n" + "".join(self.stderr_tail)
                )
            time.sleep(0.02)

    def wait_workers(self, sidecar: str, count: int, timeout_s: float = 30.0) -> list[int]:
        """Block until ``sidecar`` has ``count`` ready workers; their pids."""
        deadline = time.monotonic() + timeout_s
        while True:
            ready = [w["pid"] for w in self.sidecar(sidecar)["workers"] if w["state"] == "ready"]
            if len(ready) >= count:
                return ready
            if time.monotonic() > deadline:
                raise TimeoutError(f"{sidecar}: {len(ready)} of {count} workers ready")
            time.sleep(0.02)
