"""SIGTERM drains for ``host.shutdownGraceMs``; the calls it cuts say so (issue 26, item 17)."""

from __future__ import annotations

import json
import signal
import socket
import time

import trio

from tests.conftest import echo, write_registry
from tests.e2e.conftest import serve
from tests.e2e.test_serve import wait_visible


def invoke(rid: int, seconds: float) -> bytes:
    req = {
        "id": rid,
        "method": "tools.invoke",
        "params": {
            "tool": "echo.sleep",
            "input": {"seconds": seconds, "steps": max(1, int(seconds * 20))},
            "stream": True,
        },
    }
    return json.dumps(req).encode() + b"\n"


def test_running_calls_get_the_grace_and_the_ones_cut_name_it(tmp_path):
    root = tmp_path / "app"
    write_registry(
        root,
        {"echo": echo(tools=["echo.sleep"], pool={"min": 2, "max": 2})},
        host={"shutdownGraceMs": 1500},
    )
    sock = root / ".toolhost" / "host.sock"
    with serve(root) as host:
        trio.run(wait_visible, sock, ["echo.sleep"])
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(30)
            s.connect(str(sock))
            s.sendall(invoke(1, 0.5) + invoke(2, 60))
            reader = s.makefile("rb")
            started = set()
            while len(started) < 2:  # both are running on a worker
                msg = json.loads(reader.readline())
                if msg.get("event") == "tool.start":
                    started.add(msg["id"])
            t0 = time.monotonic()
            host.send_signal(signal.SIGTERM)
            answers = {}
            while len(answers) < 2:
                msg = json.loads(reader.readline())
                if "result" in msg:
                    answers[msg["id"]] = msg["result"]
        assert host.wait(timeout=30) == 0
        took = time.monotonic() - t0
    assert answers[1]["status"] == "success", answers[1]  # it ended within the grace
    cut = answers[2]
    assert cut["status"] == "failed" and cut["error"]["code"] == "cancelled", cut
    assert cut["error"]["message"] == "host shutting down: shutdownGraceMs (1500 ms) elapsed", cut
    assert 1.4 < took < 20, took  # the grace, not the 60 s call nor the old 5 s
