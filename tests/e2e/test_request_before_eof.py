"""A request written just before the client hangs up is carried out (issue 18, item 1).

The race made certain: ``toolhost serve`` is paused with SIGSTOP while a client connects (the
kernel completes the connection from the listen backlog), writes ``packages.rollback`` with
``confirm: true`` and a read-only ``packages.status``, and closes its end; then the host is
resumed and finds the two frames and the EOF together. The rollback must happen; the status may
be dropped, and the host logs both decisions.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import threading

import trio

from supervisor.packages.manager import PackageManager
from tests.conftest import write_registry
from tests.e2e.conftest import serve
from tests.e2e.test_serve import wait_visible
from tests.pkgkit import TOOL, build, installed_version, registry_entry


def install_offline(root, src, *versions):
    mgr = PackageManager(root)
    mgr.lock.acquire()
    try:
        for version in versions:
            mgr.stage(build(src, version))
            mgr.execute(mgr.prepare_apply("greet"))
    finally:
        mgr.lock.release()


class HostLog:
    """The host's stderr, read on a thread (the pipe never fills), searchable as a whole."""

    def __init__(self, proc) -> None:
        self.text = ""
        self._cond = threading.Condition()
        threading.Thread(target=self._pump, args=(proc,), daemon=True).start()

    def _pump(self, proc) -> None:
        for raw in proc.stderr:
            with self._cond:
                self.text += raw.decode(errors="replace")
                self._cond.notify_all()

    def wait(self, needle: str, timeout: float = 30) -> None:
        with self._cond:
            if not self._cond.wait_for(lambda: needle in self.text, timeout=timeout):
                raise AssertionError(f"no {needle!r} in the host's log:\n{self.text}")


def test_a_rollback_written_just_before_hanging_up_is_carried_out(tmp_path):
    root = tmp_path / "app"
    write_registry(root, {})
    src = tmp_path / "src"
    src.mkdir()
    install_offline(root, src, "1.0.0", "1.1.0")
    sock = root / ".toolhost" / "host.sock"
    with serve(root) as host:
        log = HostLog(host)
        trio.run(wait_visible, sock, [TOOL])
        frames = [
            {"id": 1, "method": "packages.rollback", "params": {"id": "greet", "confirm": True}},
            {"id": 2, "method": "packages.status", "params": {}},
        ]
        os.kill(host.pid, signal.SIGSTOP)
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.connect(str(sock))
                s.sendall(b"".join(json.dumps(f).encode() + b"\n" for f in frames))
        finally:
            os.kill(host.pid, signal.SIGCONT)
        log.wait("packages: rollback greet")  # the host finished the transaction
        assert installed_version(root) == "1.0.0", "the rollback was lost"
        assert installed_version(root, where=".previous") == "1.1.0"
        assert registry_entry(root)["packageVersion"] == "1.0.0"
        log.wait("request 1 (packages.rollback)")
        log.wait("dropped request 2 (packages.status")  # queued or running: read-only either way
