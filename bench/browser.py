"""The browser sidecar against real headless Chromium: ``python -m bench.browser``.

# Strategy: one run starts Chromium (``--remote-debugging-port=0``, port from
# ``DevToolsActivePort``), a loopback page server with a reference page, and ``toolhost serve``
# with the ``browser`` entry ``toolhost init --add browser`` writes. Two clients then send the
# same work in alternating rounds, so load drifts hit both alike:
#   * direct: a plain trio-websocket client on Chromium's browser socket, attached to the same
#     tab (flattened session), sending ``Runtime.evaluate`` / ``Page.captureScreenshot`` /
#     ``Accessibility.getFullAXTree`` itself;
#   * toolhost: NDJSON ``tools.invoke`` on the host's Unix socket (``bench/clients.py``).
# The figure of merit is the p50 ratio of ``browser.evaluate 1+1`` through toolhost to the
# direct ``Runtime.evaluate``. Results go to stdout and a JSON record (``--out``).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import msgspec
import trio
from trio_websocket import open_websocket_url

from bench.clients import LineClient, check_envelope, ndjson
from bench.host import BenchHost
from bench.machine import git_info, machine_info
from bench.stats import Stats

DEFAULT_OUT = Path(__file__).resolve().parent / "out" / "browser.json"
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1024,768",
]
PARAGRAPH = (
    "Toolhost hosts the tools an agent uses; this paragraph is filler text that a snapshot has"
    " to read, like the body of an ordinary article page. "
)
REFERENCE_PAGE = (
    "<!doctype html><html><head><title>Reference page</title><style>"
    "body{font-family:sans-serif;margin:2em;background:#fafafa} nav a{margin-right:1em}"
    ".card{border:1px solid #ccc;padding:1em;margin:1em 0;background:#fff}</style></head><body>"
    "<nav>"
    + "".join(f'<a href="/p{i}">Section {i}</a>' for i in range(20))
    + "</nav><h1>Reference page</h1>"
    + "".join(
        f'<div class="card"><h2>Card {i}</h2><p>{PARAGRAPH * 3}</p>'
        f'<button id="b{i}">Action {i}</button></div>'
        for i in range(30)
    )
    + '<form action="/s"><input name="q" aria-label="Search"><input name="n" aria-label="Name">'
    "<select aria-label=Choice><option>a</option><option>b</option></select>"
    "<button>Send</button></form></body></html>"
)


def find_chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome", "chrome"):
        path = shutil.which(name)
        if path:
            return path
    raise SystemExit("bench.browser: Chromium is not installed (apt-get install chromium)")


class Browser:
    """A headless Chromium for the run."""

    def __init__(self) -> None:
        self.profile = tempfile.mkdtemp(prefix="toolhost-bench-chromium-")
        self.proc = subprocess.Popen(
            [
                find_chromium(),
                *FLAGS,
                f"--user-data-dir={self.profile}",
                "--remote-debugging-port=0",
                "about:blank",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        active = Path(self.profile) / "DevToolsActivePort"
        limit = time.monotonic() + 30
        while True:
            try:
                lines = active.read_text().splitlines()
                if len(lines) >= 2:
                    break
            except FileNotFoundError:
                pass
            if time.monotonic() > limit or self.proc.poll() is not None:
                raise SystemExit("bench.browser: Chromium did not start")
            time.sleep(0.05)
        self.port = int(lines[0])
        self.ws_url = f"ws://127.0.0.1:{self.port}{lines[1]}"

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()
        shutil.rmtree(self.profile, ignore_errors=True)


def page_server() -> ThreadingHTTPServer:
    body = REFERENCE_PAGE.encode()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


class Direct:
    """The baseline: CDP requests on the browser socket, flattened session on the same tab."""

    def __init__(self, ws: Any, session: str) -> None:
        self.ws = ws
        self.session = session
        self.next_id = 0

    async def call(self, method: str, params: dict[str, Any]) -> Any:
        self.next_id += 1
        rid = self.next_id
        body = {"id": rid, "method": method, "params": params}
        if self.session:
            body["sessionId"] = self.session
        await self.ws.send_message(msgspec.json.encode(body).decode())
        while True:
            msg = msgspec.json.decode(await self.ws.get_message())
            if msg.get("id") == rid:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg["result"]


class SidecarPipes:
    """The browser sidecar spawned alone, spoken to over its pipes (no host): where the time
    goes between the direct client and toolhost."""

    def __init__(self, endpoint: str, root: Path) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "sidecars.browser_cdp"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            cwd=str(root),
        )
        self.next_id = 0
        init = {
            "type": "init",
            "protocol": 1,
            "sidecar": "browser",
            "config": {"endpoint": endpoint},
            "projectDir": str(root),
            "configDir": str(root),
            "cwd": str(root),
        }
        self._send(init)
        self._answer()  # ready

    def _send(self, msg: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(msgspec.json.encode(msg) + b"\n")
        self.proc.stdin.flush()

    def _answer(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        while True:
            msg: dict[str, Any] = msgspec.json.decode(self.proc.stdout.readline())
            if msg.get("type") in ("ready", "result"):
                return msg

    def evaluate(self, target: str) -> float:
        self.next_id += 1
        call = {
            "type": "call",
            "id": self.next_id,
            "tool": "browser.evaluate",
            "input": {"targetId": target, "expression": "1+1"},
            "deadlineMs": 10000,
        }
        t0 = time.perf_counter()
        self._send(call)
        answer = self._answer()
        elapsed = time.perf_counter() - t0
        if not answer.get("ok"):
            raise RuntimeError(f"sidecar call failed: {answer}")
        return elapsed

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(10)


def invoke_line(tool: str, params: dict[str, Any], rid: int) -> bytes:
    request: dict[str, Any] = {
        "id": rid,
        "method": "tools.invoke",
        "params": {"tool": tool, "input": params},
    }
    if tool == "browser.evaluate":
        request["params"]["approval"] = {"granted": True, "by": "bench"}
    return ndjson(request)


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    browser = Browser()
    server = page_server()
    page_url = f"http://127.0.0.1:{server.server_address[1]}/"
    from supervisor.cli.init import bundled_registry

    entry = bundled_registry(["browser"])["sidecars"]["browser"]
    entry["config"] = {"endpoint": browser.endpoint}
    host = BenchHost({"browser": entry}).start()
    try:
        host.wait_tools(["browser.open", "browser.evaluate"])
        client = LineClient(host.connect())
        env = check_envelope(client.roundtrip(invoke_line("browser.open", {"url": page_url}, 1)))
        target = env["data"]["targetId"]

        def through_host(tool: str, params: dict[str, Any]) -> float:
            line = invoke_line(tool, params, 2)
            t0 = time.perf_counter()
            check_envelope(client.roundtrip(line))
            return time.perf_counter() - t0

        async with open_websocket_url(browser.ws_url, max_message_size=1 << 28) as ws:
            plain = Direct(ws, "")
            attached = await plain.call(
                "Target.attachToTarget", {"targetId": target, "flatten": True}
            )
            direct = Direct(ws, attached["sessionId"])

            async def direct_time(method: str, params: dict[str, Any]) -> float:
                t0 = time.perf_counter()
                await direct.call(method, params)
                return time.perf_counter() - t0

            samples: dict[str, list[float]] = {k: [] for k in KEYS}
            # Exactly the Runtime.evaluate the sidecar sends for browser.evaluate.
            evaluate = {
                "expression": "1+1",
                "returnByValue": True,
                "awaitPromise": True,
                "userGesture": True,
            }
            pipes = SidecarPipes(browser.endpoint, host.root)
            for _ in range(50):  # warm both paths
                await direct_time("Runtime.evaluate", evaluate)
                through_host("browser.evaluate", {"targetId": target, "expression": "1+1"})
                pipes.evaluate(target)
            rounds = 10
            for _ in range(rounds):
                for _ in range(args.calls // rounds):
                    samples["direct evaluate"].append(
                        await direct_time("Runtime.evaluate", evaluate)
                    )
                    samples["toolhost evaluate"].append(
                        through_host("browser.evaluate", {"targetId": target, "expression": "1+1"})
                    )
                    samples["sidecar over pipes evaluate"].append(pipes.evaluate(target))
                for _ in range(max(1, args.heavy // rounds)):
                    samples["direct captureScreenshot"].append(
                        await direct_time("Page.captureScreenshot", {"format": "png"})
                    )
                    samples["toolhost screenshot"].append(
                        through_host(
                            "browser.screenshot", {"targetId": target, "path": "bench.png"}
                        )
                    )
                    samples["direct getFullAXTree"].append(
                        await direct_time("Accessibility.getFullAXTree", {})
                    )
                    samples["toolhost snapshot"].append(
                        through_host("browser.snapshot", {"targetId": target})
                    )
            pipes.close()
        client.close()
    finally:
        host.stop()
        server.shutdown()
        browser.stop()
    stats = {k: Stats.of(v) for k, v in samples.items()}
    ratio = stats["toolhost evaluate"].p50 / stats["direct evaluate"].p50
    return {
        "schema": "toolhost-bench-browser/1",
        "machine": machine_info(),
        "git": git_info(),
        "chromium": find_chromium(),
        "calls": args.calls,
        "heavy": args.heavy,
        "rows": {k: {**s.__dict__, "cdf": None} for k, s in stats.items()},
        "evaluate_p50_ratio": ratio,
        "target": {"evaluate_p50_ratio_max": 1.3, "met": ratio <= 1.3},
    }


KEYS = [
    "direct evaluate",
    "toolhost evaluate",
    "sidecar over pipes evaluate",
    "direct captureScreenshot",
    "toolhost screenshot",
    "direct getFullAXTree",
    "toolhost snapshot",
]


def report(record: dict[str, Any]) -> str:
    lines = [
        f"{'row':<28} {'n':>6} {'p50 us':>10} {'p90 us':>10} {'p99 us':>10}",
    ]
    for key in KEYS:
        row = record["rows"][key]
        lines.append(
            f"{key:<28} {row['n']:>6} {row['p50']:>10.0f} {row['p90']:>10.0f} {row['p99']:>10.0f}"
        )
    ratio = record["evaluate_p50_ratio"]
    verdict = "met" if record["target"]["met"] else "NOT met"
    lines.append(
        f"browser.evaluate p50 / direct Runtime.evaluate p50 = {ratio:.2f}x (<= 1.3x: {verdict})"
    )
    rows = record["rows"]
    for ours, theirs in (
        ("toolhost screenshot", "direct captureScreenshot"),
        ("toolhost snapshot", "direct getFullAXTree"),
    ):
        lines.append(f"{ours} / {theirs} p50 = {rows[ours]['p50'] / rows[theirs]['p50']:.2f}x")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run the browser bench; print the table and write the JSON record."""
    p = argparse.ArgumentParser(prog="python -m bench.browser", description=__doc__)
    p.add_argument("--calls", type=int, default=2000, help="evaluate calls per client")
    p.add_argument("--heavy", type=int, default=100, help="screenshot/snapshot calls per client")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="JSON record")
    args = p.parse_args(argv)
    record = trio.run(measure, args)
    print(report(record))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=2))
    print(f"record: {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
