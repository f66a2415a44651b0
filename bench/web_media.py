"""Bench of the web and media sidecars: the bridge's overhead against the same work done
directly, in one run (``python -m bench.web_media``; see bench/README.md).

- ``web.fetch`` (``as: raw``) of a 100 KB loopback page through ``toolhost serve`` (Unix
  socket, NDJSON, one call in flight) vs the same GET by a plain pooled ``httpx.Client`` in
  this process. Target: p50 ratio <= 1.3.
- each media delegate through toolhost vs running its engine directly on the same file
  (``tesseract``/``espeak-ng`` CLI; pocketsphinx and Pillow in a fresh Python process, as the
  delegate runs them). Target: p50 ratio <= 1.2.

Rounds alternate toolhost and baseline so drift on the shared machine hits both alike.
"""

from __future__ import annotations

import argparse
import functools
import json
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from bench.host import BenchHost

DELEGATE_MODULES = {
    "vision.ocr": "ocr",
    "audio.speak": "speak",
    "audio.transcribe": "transcribe",
    "vision.analyze": "analyze",
}
PAGE = (b"<html><body><article>" + b"<p>lorem ipsum dolor sit amet</p>" * 3200)[:102_400]


class _Page(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(PAGE)))
        self.end_headers()
        self.wfile.write(PAGE)


def p50(samples: list[float]) -> float:
    ordered = sorted(samples)
    return ordered[len(ordered) // 2]


def timed(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def invoke(host: BenchHost, tool: str, payload: dict[str, Any]) -> dict[str, Any]:
    env: dict[str, Any] = host.control.request(
        "tools.invoke", {"tool": tool, "input": payload, "timeoutMs": 60_000}
    )
    if env["status"] != "success":
        raise RuntimeError(f"{tool}: {env['content']}")
    return env


def compare(
    rows: list[tuple[str, float, float, float]],
    name: str,
    through: Callable[[], Any],
    direct: Callable[[], Any],
    rounds: int,
    target: float,
) -> None:
    through(), direct()  # warm both paths (pool, page cache, imports)
    a: list[float] = []
    b: list[float] = []
    for _ in range(rounds):
        a.append(timed(through))
        b.append(timed(direct))
    rows.append((name, p50(a) * 1000, p50(b) * 1000, target))


def media_direct(project: Path) -> dict[str, list[str]]:
    """The engine run directly, outside toolhost, on the same files."""
    py = sys.executable
    sphinx = (
        "import sys, wave; from pocketsphinx import Decoder; w = wave.open(sys.argv[1]); "
        "d = Decoder(samprate=w.getframerate(), loglevel='FATAL'); d.start_utt(); "
        "d.process_raw(w.readframes(w.getnframes()), full_utt=True); d.end_utt(); "
        "print(d.hyp().hypstr)"
    )
    pillow = (
        "import sys; from PIL import Image; im = Image.open(sys.argv[1]); im.getexif(); "
        "t = im.convert('RGB'); t.thumbnail((256, 256)); q = t.quantize(colors=8); "
        "print(q.getcolors(8))"
    )
    return {
        "vision.ocr": ["tesseract", str(project / "sign.png"), "stdout", "-l", "eng"],
        "audio.speak": ["espeak-ng", "-w", str(project / "direct.wav"), "one two three four"],
        "audio.transcribe": [py, "-c", sphinx, str(project / "phrase.wav")],
        "vision.analyze": [py, "-c", pillow, str(project / "sign.png")],
    }


def main(argv: list[str] | None = None) -> int:
    """Run the bench and print a Markdown table of p50 milliseconds and ratios."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--fetches", type=int, default=200)
    ap.add_argument("--media-rounds", type=int, default=10)
    ap.add_argument("--web-only", action="store_true", help="skip the media rows")
    args = ap.parse_args(argv)
    import httpx
    from PIL import Image, ImageDraw, ImageFont

    server = ThreadingHTTPServer(("127.0.0.1", 0), _Page)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/page"
    delegates = {
        tool: {"command": "python", "args": ["-m", f"sidecars.media.delegates.{mod}"]}
        for tool, mod in DELEGATE_MODULES.items()
    }
    common = {"command": "python", "pool": {"min": 1, "max": 1}}
    sidecars = {
        "web": {
            **common,
            "args": ["-m", "sidecars.web"],
            "tools": ["web.fetch", "web.extract", "web.download", "web.search"],
            "config": {"allowPrivate": True},
        },
        "media": {
            **common,
            "args": ["-m", "sidecars.media"],
            "tools": list(delegates),
            "config": {"localCommands": delegates},
        },
    }
    rows: list[tuple[str, float, float, float]] = []
    with BenchHost(sidecars) as host, httpx.Client() as client:
        host.wait_tools(["web.fetch", *delegates])
        compare(
            rows,
            "web.fetch 100 KB (vs plain httpx)",
            lambda: invoke(host, "web.fetch", {"url": url, "as": "raw"}),
            lambda: client.get(url).content,
            args.fetches,
            1.3,
        )
        project = host.root
        image = Image.new("RGB", (900, 140), "white")
        font = ImageFont.load_default(size=48)
        ImageDraw.Draw(image).text((30, 40), "Toolhost reads words", fill="black", font=font)
        image.save(project / "sign.png")
        invoke(host, "audio.speak", {"text": "one two three four", "path": "phrase.wav"})
        direct = media_direct(project)
        inputs: dict[str, dict[str, Any]] = {
            "vision.ocr": {"path": "sign.png"},
            "audio.speak": {"text": "one two three four", "path": "out.wav", "overwrite": True},
            "audio.transcribe": {"path": "phrase.wav"},
            "vision.analyze": {"path": "sign.png"},
        }
        for tool, payload in inputs.items() if not args.web_only else ():
            if shutil.which(direct[tool][0]) is None and not direct[tool][0].startswith("/"):
                print(f"skip {tool}: {direct[tool][0]} not installed", file=sys.stderr)
                continue
            compare(
                rows,
                f"{tool} (vs the engine directly)",
                functools.partial(invoke, host, tool, payload),
                functools.partial(subprocess.run, direct[tool], check=True, capture_output=True),
                args.media_rounds,
                1.2,
            )
            # The same delegate run alone (no host, no sidecar): splits the overhead into the
            # delegate's own interpreter start and the bridge around it.
            absolute = dict(payload)
            alone = "alone.wav" if tool == "audio.speak" else payload["path"]
            absolute["path"] = str(project / alone)
            line = json.dumps({"tool": tool, "input": absolute}).encode() + b"\n"
            module = f"sidecars.media.delegates.{DELEGATE_MODULES[tool]}"
            compare(
                rows,
                f"{tool} delegate alone (vs the engine directly)",
                functools.partial(
                    subprocess.run,
                    [sys.executable, "-m", module],
                    input=line,
                    check=True,
                    capture_output=True,
                ),
                functools.partial(subprocess.run, direct[tool], check=True, capture_output=True),
                args.media_rounds,
                0,
            )
    server.shutdown()
    print("| call | p50 ms | baseline p50 ms | ratio | target |")
    print("|---|---:|---:|---:|---:|")
    for name, through_ms, direct_ms, target in rows:
        ratio = through_ms / direct_ms
        judged = (f"<= {target}x " + ("met" if ratio <= target else "MISSED")) if target else "-"
        print(f"| {name} | {through_ms:.2f} | {direct_ms:.2f} | {ratio:.2f}x | {judged} |")
    return 0


if __name__ == "__main__":
    with tempfile.TemporaryDirectory():
        sys.exit(main())
