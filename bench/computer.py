"""computer.use vs computer.mouse, lsp.symbols vs direct pylsp: ``python -m bench.computer``.

# Strategy: one run starts Xvfb on a display it picks (``-displayfd``) and ``toolhost serve`` with
# ``computer.native`` (the xdotool delegate ``toolhost init --add computer`` writes), the
# ``computer.use`` facade, and the utility sidecar with ``lspCommand`` = pylsp. Over one NDJSON
# client on the host's Unix socket, in alternating rounds (so load drifts hit both alike):
#   * ``computer.mouse {click}`` directly vs ``computer.use {left_click}`` (one extra hop: the
#     facade's ``tools.invoke`` worker request and the child call through the gates); target: p50
#     of the facade at most 1.5x the direct call;
#   * ``lsp.symbols`` first call (language server start + initialize, forced again by killing the
#     server) and warm, next to a direct client (``sidecars.utility.lsp.LanguageServer`` in this
#     process: the same framing, no host, no sidecar) doing the same: start + initialize +
#     didOpen + documentSymbol, and a warm documentSymbol.
# Results go to stdout and a JSON record (``--out``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import msgspec

from bench.clients import LineClient, ndjson
from bench.host import BenchHost
from bench.machine import git_info, machine_info
from bench.stats import Stats
from sidecars.utility.lsp import LanguageServer
from supervisor.cli.init import XDO_KEYBOARD, XDO_MOUSE

DEFAULT_OUT = Path(__file__).resolve().parent / "out" / "computer.json"
MODULE = """import os


def greet(name):
    return "hello " + name


class Box:
    def open(self):
        return undefined_thing
"""
APPROVAL = {"granted": True, "by": "bench"}


def start_xvfb() -> tuple[subprocess.Popen[bytes], str]:
    read_fd, write_fd = os.pipe()
    proc = subprocess.Popen(
        ["Xvfb", "-displayfd", str(write_fd), "-screen", "0", "1024x768x24", "-nolisten", "tcp"],
        pass_fds=(write_fd,),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    os.close(write_fd)
    with os.fdopen(read_fd) as f:
        number = f.readline().strip()
    if not number:
        proc.kill()
        raise RuntimeError("Xvfb did not report a display")
    return proc, f":{number}"


def call(client: LineClient, tool: str, input: dict[str, Any], approve: bool = True) -> Any:
    params: dict[str, Any] = {"tool": tool, "input": input, "timeoutMs": 60000}
    if approve:
        params["approval"] = APPROVAL
    raw = client.roundtrip(ndjson({"id": 1, "method": "tools.invoke", "params": params}))
    env = msgspec.json.decode(raw)["result"]
    if env["status"] != "success":
        raise RuntimeError(f"{tool}: {env['content']}")
    return env["data"]


def timed(fn: Any) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def direct_lsp(root: Path, argv: list[str], warm_n: int) -> tuple[list[float], list[float]]:
    """Cold (start .. first documentSymbol) and warm documentSymbol times of a direct client."""
    uri = (root / "mod.py").as_uri()
    params = {"textDocument": {"uri": uri}}
    server = LanguageServer(argv, str(root))
    t = time.perf_counter()
    server.initialize(time.monotonic() + 60)
    server.sync(uri, MODULE)
    server.request("textDocument/documentSymbol", params, time.monotonic() + 60)
    cold = time.perf_counter() - t
    # Let the server finish linting the new document before timing warm requests (the host
    # side does the same with an lsp.diagnostics call).
    server.wait_diagnostics(uri, 0, 0.3, time.monotonic() + 30)
    warm = [
        timed(lambda: server.request("textDocument/documentSymbol", params, time.monotonic() + 60))
        for _ in range(warm_n)
    ]
    server.stop()
    return [cold], warm


def row(name: str, samples: list[float], baseline: Stats | None = None) -> dict[str, Any]:
    s = Stats.of(samples)
    out: dict[str, Any] = {"name": name, "n": s.n, "p50_us": s.p50, "p90_us": s.p90}
    if baseline is not None:
        out["p50_ratio"] = s.p50 / baseline.p50
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.computer", description=__doc__)
    ap.add_argument("--calls", type=int, default=200, help="clicks per client (default 200)")
    ap.add_argument("--lsp-calls", type=int, default=200, help="warm lsp.symbols per client")
    ap.add_argument("--cold", type=int, default=5, help="language server starts per client")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args(argv)
    missing = [exe for exe in ("Xvfb", "xdotool", "pylsp") if shutil.which(exe) is None]
    if missing and not (missing == ["pylsp"] and _has_module("pylsp")):
        print(f"bench.computer needs {', '.join(missing)}", file=sys.stderr)
        return 2
    xvfb, display = start_xvfb()
    pylsp = [sys.executable, "-m", "pylsp"]
    sidecars = {
        "computer.native": {
            "command": "python",
            "args": ["-m", "sidecars.computer"],
            "tools": [
                "screen.screenshot",
                "computer.window",
                "computer.mouse",
                "computer.keyboard",
            ],
            "env": {"DISPLAY": display},
            "pool": {"min": 1, "max": 1},
            "config": {"mouseCommand": XDO_MOUSE, "keyboardCommand": XDO_KEYBOARD},
        },
        "computer.use": {
            "command": "python",
            "args": ["-m", "sidecars.computer_use"],
            "tools": ["computer.use"],
            "pool": {"min": 1, "max": 1},
        },
        "utility": {
            "command": "python",
            "args": ["-m", "sidecars.utility"],
            "tools": ["file.hash", "lsp.symbols", "lsp.diagnostics"],
            "pool": {"min": 1, "max": 1},
            "config": {"lspCommand": ["python", "-m", "pylsp"]},
        },
    }
    results: dict[str, Any] = {"machine": machine_info(), "git": git_info(), "rows": []}
    try:
        with BenchHost(sidecars) as host:
            (host.root / "mod.py").write_text(MODULE)
            host.wait_tools(["computer.use", "computer.mouse", "lsp.symbols"])
            client = LineClient(host.connect())
            click = {"action": "click", "x": 500, "y": 400}
            use = {"action": "left_click", "coordinate": [500, 400]}
            for _ in range(20):  # warm both paths
                call(client, "computer.mouse", click)
                call(client, "computer.use", use)
            direct: list[float] = []
            facade: list[float] = []
            for _ in range(args.calls):
                direct.append(timed(lambda: call(client, "computer.mouse", click)))
                facade.append(timed(lambda: call(client, "computer.use", use)))
            base = Stats.of(direct)
            results["rows"] += [
                row("computer.mouse click (direct)", direct),
                row("computer.use left_click (facade)", facade, base),
            ]

            lsp_in = {"path": "mod.py"}
            cold_host: list[float] = []
            cold_direct: list[float] = []
            warm_direct: list[float] = []
            for i in range(args.cold):
                t = time.perf_counter()
                data = call(client, "lsp.symbols", lsp_in, approve=False)
                cold_host.append(time.perf_counter() - t)
                os.kill(data["server"]["pid"], signal.SIGKILL)  # the next call starts a new one
                c, w = direct_lsp(host.root, pylsp, args.lsp_calls if i == 0 else 0)
                cold_direct += c
                warm_direct += w
            call(client, "lsp.symbols", lsp_in, approve=False)
            call(client, "lsp.diagnostics", lsp_in, approve=False)
            warm_host = [
                timed(lambda: call(client, "lsp.symbols", lsp_in, approve=False))
                for _ in range(args.lsp_calls)
            ]
            cold_base = Stats.of(cold_direct)
            warm_base = Stats.of(warm_direct)
            results["rows"] += [
                row("pylsp direct client: start + initialize + documentSymbol", cold_direct),
                row("lsp.symbols first call (server start) via toolhost", cold_host, cold_base),
                row("pylsp direct client: documentSymbol (warm)", warm_direct),
                row("lsp.symbols warm via toolhost", warm_host, warm_base),
            ]
            client.close()
    finally:
        xvfb.terminate()
        xvfb.wait()
    for r in results["rows"]:
        ratio = f"  {r['p50_ratio']:.2f}x" if "p50_ratio" in r else ""
        print(f"{r['name']:<62} n={r['n']:<4} p50 {r['p50_us'] / 1000:8.2f} ms{ratio}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2))
    return 0


def _has_module(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


if __name__ == "__main__":
    sys.exit(main())
