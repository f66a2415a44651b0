"""``toolhost serve --log-format json``: every stderr line is one JSON object, sidecar stderr
comes through as records tagged with sidecar and pid, and a flooding sidecar is rate-limited
with a count of the lines dropped."""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from typing import Any

from tests.conftest import echo, script, write_registry
from tests.e2e.conftest import TOOLHOST, stop
from tests.e2e.test_serve import plain_call


class Lines:
    """Reads the host's stderr on a thread, parsing each line as JSON."""

    def __init__(self, stream: Any) -> None:
        self.records: list[dict[str, Any]] = []
        self.bad: list[str] = []
        self.cond = threading.Condition()
        threading.Thread(target=self._read, args=(stream,), daemon=True).start()

    def _read(self, stream: Any) -> None:
        for raw in stream:
            line = raw.decode(errors="replace").rstrip("\n")
            try:
                rec = json.loads(line)
            except ValueError:
                rec = None
            with self.cond:
                if isinstance(rec, dict):
                    self.records.append(rec)
                else:
                    self.bad.append(line)
                self.cond.notify_all()

    def wait(self, pred: Any, what: str, timeout: float = 60) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                for rec in self.records:
                    if pred(rec):
                        return rec
                left = deadline - time.monotonic()
                assert left > 0, f"no {what} in {len(self.records)} records: {self.records[-5:]}"
                self.cond.wait(left)


def test_json_logs_with_forwarded_sidecar_stderr(tmp_path):
    root = tmp_path / "app"
    root.mkdir()
    write_registry(
        root,
        {
            "echo": echo(tools=["echo.say", "echo.crash"]),
            "flood": script("stderr_flood", ["flood.echo"]),
        },
    )
    proc = subprocess.Popen(
        [*TOOLHOST, "serve", "--app-root", str(root), "--log-format", "json"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env={**os.environ, "XDG_CONFIG_HOME": str(root / ".xdg")},
    )
    try:
        lines = Lines(proc.stderr)
        serving = lines.wait(
            lambda r: "toolhost serving" in r.get("message", ""), "the serving line"
        )
        sock = root / ".toolhost" / "host.sock"
        # A call whose sidecar writes a known line to stderr before it dies.
        deadline = time.monotonic() + 60
        while True:
            resp = plain_call(
                sock, {"id": 1, "method": "tools.invoke", "params": {"tool": "echo.crash"}}
            )
            if resp["result"]["error"]["code"] == "worker-crashed" or time.monotonic() > deadline:
                break
        assert resp["result"]["error"]["code"] == "worker-crashed", resp
        crashed_pid = resp["result"]["meta"]["pid"]
        said = lines.wait(
            lambda r: r.get("sidecar") == "echo" and r.get("message") == "about to crash",
            "forwarded stderr line of echo",
        )
        assert said["logger"] == "toolhost.sidecar" and said["stream"] == "stderr"
        assert said["pid"] == crashed_pid and said["level"] == "info"
        # The flood is cut down to a rate, and what was dropped is counted.
        dropped = lines.wait(
            lambda r: r.get("sidecar") == "flood" and r.get("dropped", 0) > 0,
            "a dropped-lines record for the flooding sidecar",
        )
        assert dropped["level"] == "warning" and "dropped" in dropped["message"]
    finally:
        stop(proc)
    assert serving["logger"] == "toolhost"
    for rec in (said, dropped, serving):
        assert {"time", "level", "logger", "message"} <= set(rec)
    assert not lines.bad, lines.bad[:3]
