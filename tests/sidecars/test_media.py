"""The media sidecar against the real engines (tesseract, espeak-ng, pocketsphinx, Pillow), a
fake HTTP provider of the test, and delegates that crash, hang or answer garbage.

Tools run in-process through ``app.execute`` (the SDK's dispatch); delegates and providers are
real processes and real sockets. The last tests run the sidecar under a real host.
"""

from __future__ import annotations

import base64
import json
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import msgspec
import pytest

from sidecars.media import app
from sidecars.sdk import Context
from supervisor.contracts import wire
from tests.sidecars.engines import need_binary, need_module

PY = sys.executable
DELEGATES = {
    "vision.ocr": {"command": "python", "args": ["-m", "sidecars.media.delegates.ocr"]},
    "audio.speak": {"command": "python", "args": ["-m", "sidecars.media.delegates.speak"]},
    "audio.transcribe": {
        "command": "python",
        "args": ["-m", "sidecars.media.delegates.transcribe"],
    },
    "vision.analyze": {"command": "python", "args": ["-m", "sidecars.media.delegates.analyze"]},
}


def py(code: str) -> dict[str, Any]:
    """A delegate that runs ``code`` with the sidecar's python."""
    return {"command": "python", "args": ["-c", code]}


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "project"
    root.mkdir()
    monkeypatch.setattr(app, "project_dir", str(root))
    monkeypatch.setattr(app, "cwd", str(root))
    monkeypatch.setattr(app, "config", {"localCommands": DELEGATES})
    return root


def run(tool: str, payload: dict[str, Any], deadline_ms: int = 30_000) -> wire.Result:
    return app.execute(
        tool, msgspec.json.encode(payload), Context(app, 1, deadline_ms, threading.Event())
    )


def ok(tool: str, payload: dict[str, Any], deadline_ms: int = 30_000) -> dict[str, Any]:
    result = run(tool, payload, deadline_ms)
    assert result.ok, (result.code, result.error, result.details)
    return msgspec.json.decode(result.data)


def text_png(path: Path, text: str) -> None:
    from PIL import Image, ImageDraw, ImageFont

    image = Image.new("RGB", (60 + 30 * len(text), 140), "white")
    ImageDraw.Draw(image).text((30, 40), text, fill="black", font=ImageFont.load_default(size=48))
    image.save(path)


# real engines --------------------------------------------------------------------------------


def test_ocr_reads_back_rendered_text(project: Path) -> None:
    need_binary("tesseract", "tesseract-ocr")
    need_module("PIL", "media")
    text_png(project / "sign.png", "Toolhost reads seven words from images")
    data = ok("vision.ocr", {"path": "sign.png"})
    words = data["text"].lower().split()
    assert words == ["toolhost", "reads", "seven", "words", "from", "images"], data
    assert data["path"] == "sign.png" and data["via"] == "delegate" and data["lang"] == "eng"


def test_speak_then_transcribe_round_trip(project: Path) -> None:
    need_binary("espeak-ng", "espeak-ng")
    need_module("pocketsphinx", "media")
    phrase = "one two three four five six seven"
    spoken = ok("audio.speak", {"text": phrase, "path": "out/phrase.wav"})
    wav = project / "out" / "phrase.wav"
    assert spoken["path"] == "out/phrase.wav" and spoken["bytes"] == wav.stat().st_size > 10_000
    assert spoken["sampleRate"] == 22050 and wav.read_bytes()[:4] == b"RIFF"
    assert [p.name for p in wav.parent.iterdir()] == ["phrase.wav"]  # no temp file left
    heard = ok("audio.transcribe", {"path": "out/phrase.wav"})["text"].split()
    recognised = [w for w in phrase.split() if w in heard]
    assert len(recognised) >= 5, heard
    again = run("audio.speak", {"text": "x", "path": "out/phrase.wav"})
    assert (again.code, (again.details or {}).get("reason")) == ("invalid-input", "exists")


def test_analyze_reports_size_and_dominant_colour(project: Path) -> None:
    need_module("PIL", "media")
    from PIL import Image

    image = Image.new("RGB", (320, 200), (200, 30, 40))
    image.paste((10, 20, 230), (0, 0, 40, 40))
    image.save(project / "flag.png")
    data = ok("vision.analyze", {"path": "flag.png"})
    assert (data["width"], data["height"], data["format"], data["mode"]) == (320, 200, "PNG", "RGB")
    top = data["dominantColors"][0]
    assert top["hex"] == "#c81e28" and top["share"] > 0.9
    assert data["dominantColors"][1]["hex"] == "#0a14e6"


def test_paths_are_confined(project: Path) -> None:
    result = run("vision.ocr", {"path": "../outside.png"})
    assert (result.code, (result.details or {}).get("reason")) == (
        "invalid-input",
        "parent-traversal",
    )
    result = run("audio.speak", {"text": "hi", "path": "/tmp/x.wav"})
    assert (result.code, (result.details or {}).get("reason")) == ("invalid-input", "absolute-path")
    assert run("vision.ocr", {"path": "missing.png"}).code == "failed"


# delegate faults ------------------------------------------------------------------------------


def configure(tool: str, entry: dict[str, Any]) -> None:
    app.config = {"localCommands": {**DELEGATES, tool: entry}}


def test_crashing_delegate_is_failed_with_exit_code_and_stderr(project: Path) -> None:
    (project / "a.png").write_bytes(b"x")
    configure("vision.ocr", py("import sys; sys.stderr.write('engine exploded'); sys.exit(3)"))
    result = run("vision.ocr", {"path": "a.png"})
    assert result.code == "failed" and "status 3" in result.error
    details = result.details or {}
    assert details["exitCode"] == 3 and "engine exploded" in details["stderr"]
    assert details["reason"] == "delegate-crashed"


def test_hanging_delegate_is_killed_at_the_deadline(project: Path) -> None:
    (project / "a.png").write_bytes(b"x")
    configure("vision.ocr", py("import time; time.sleep(60)"))
    t0 = time.monotonic()
    result = run("vision.ocr", {"path": "a.png"}, deadline_ms=800)
    took = time.monotonic() - t0
    assert result.code == "failed" and (result.details or {}).get("reason") == "timeout"
    assert took < 5, took  # killed near the deadline, not after the sleep


def test_garbage_answer_is_failed(project: Path) -> None:
    (project / "a.png").write_bytes(b"x")
    configure("vision.ocr", py("print('hello, not json')"))
    result = run("vision.ocr", {"path": "a.png"})
    details = result.details or {}
    assert result.code == "failed" and details["reason"] == "bad-answer"
    assert details["exitCode"] == 0 and "hello, not json" in details["stdout"]


def test_oversized_answer_is_killed(project: Path) -> None:
    (project / "a.png").write_bytes(b"x")
    app.config = {
        "localCommands": {"vision.ocr": py("import sys; sys.stdout.write('x' * 10_000_000)")},
        "maxDelegateOutputBytes": 4096,
    }
    result = run("vision.ocr", {"path": "a.png"})
    assert result.code == "failed" and (result.details or {})["reason"] == "output-too-large"


def test_missing_command_and_missing_engine_are_unavailable(project: Path) -> None:
    (project / "a.png").write_bytes(b"x")
    configure("vision.ocr", {"command": "no-such-ocr-engine-anywhere"})
    result = run("vision.ocr", {"path": "a.png"})
    assert result.code == "unavailable" and (result.details or {})["reason"] == "command-not-found"
    # audio.speak's delegate is one that is there on any machine (the bundled one needs
    # espeak-ng): a missing OCR command must leave it healthy.
    app.config["localCommands"]["audio.speak"] = py("pass")
    health = app.health_check(app)
    assert health["vision.ocr"].status == "unavailable"
    assert "no-such-ocr-engine-anywhere" in (health["vision.ocr"].reason or "")
    assert "audio.speak" not in health  # the others stay healthy
    # The bundled delegate itself says so when its engine is not on PATH.
    configure("vision.ocr", {**DELEGATES["vision.ocr"], "env": {"PATH": str(project)}})
    result = run("vision.ocr", {"path": "a.png"})
    assert result.code == "unavailable" and "tesseract-ocr" in result.error


def test_absolute_delegate_command_is_refused(project: Path) -> None:
    configure("vision.ocr", {"command": PY})
    health = app.health_check(app)["vision.ocr"]
    assert health.status == "unavailable" and health.code == "outside-root-denied"


def test_killed_speak_leaves_no_partial_file(project: Path) -> None:
    code = (
        "import json, sys, time; req = json.loads(sys.stdin.readline()); "
        "open(req['input']['path'], 'wb').write(b'RIFF-half'); time.sleep(60)"
    )
    configure("audio.speak", py(code))
    result = run("audio.speak", {"text": "hi", "path": "voice/out.wav"}, deadline_ms=800)
    assert result.code == "failed" and (result.details or {})["reason"] == "timeout"
    assert not (project / "voice").exists()  # neither the target, a temp file nor the folder


def test_nothing_configured_is_unavailable_with_a_hint(project: Path) -> None:
    app.config = {}
    result = run("vision.ocr", {"path": "a.png"})
    assert result.code == "unavailable" and "localCommands" in result.error
    health = app.health_check(app)
    assert set(health) == {"vision.analyze", "vision.ocr", "audio.transcribe", "audio.speak"}
    assert all("toolhost init --add media" in (h.hint or "") for h in health.values())


# fake provider --------------------------------------------------------------------------------


class Provider:
    """A loopback HTTP provider of the test: records requests, answers per ``mode``."""

    def __init__(self) -> None:
        self.mode = "ok"
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        provider = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                provider.requests.append(body)
                provider.headers.append(dict(self.headers))
                if provider.mode == "500":
                    self._send(500, b'{"error": "model overloaded"}')
                elif provider.mode == "slow":
                    time.sleep(3)
                    self._send(200, b'{"text": "late"}')
                elif provider.mode == "malformed":
                    self._send(200, b'{"words": []}')
                elif body["tool"] == "audio.speak":
                    audio = base64.b64encode(b"RIFF" + b"\0" * 100).decode()
                    self._send(200, json.dumps({"audioBase64": audio, "model": "fake"}).encode())
                else:
                    self._send(200, json.dumps({"text": "provided text", "model": "fake"}).encode())

            def _send(self, status: int, body: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                try:
                    self.wfile.write(body)
                except BrokenPipeError:
                    pass  # the client gave up (the slow case)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1/media"


@pytest.fixture
def provider(project: Path) -> Iterator[Provider]:
    fake = Provider()
    thread = threading.Thread(target=fake.server.serve_forever, daemon=True)
    thread.start()
    app.config = {"providerUrl": fake.url, "providerHeaders": {"Authorization": "Bearer t0k"}}
    yield fake
    fake.server.shutdown()
    fake.server.server_close()


def test_provider_ok_gets_the_file_and_headers(project: Path, provider: Provider) -> None:
    (project / "scan.png").write_bytes(b"\x89PNG fake")
    data = ok("vision.ocr", {"path": "scan.png", "lang": "deu"})
    assert data == {"text": "provided text", "model": "fake", "path": "scan.png", "via": "provider"}
    sent = provider.requests[0]
    assert sent["tool"] == "vision.ocr" and sent["input"] == {"lang": "deu"}
    assert base64.b64decode(sent["file"]["base64"]) == b"\x89PNG fake"
    assert provider.headers[0]["Authorization"] == "Bearer t0k"
    spoken = ok("audio.speak", {"text": "hello", "path": "hello.wav"})
    assert spoken["via"] == "provider" and (project / "hello.wav").read_bytes()[:4] == b"RIFF"
    assert app.health_check(app) == {}  # every tool routed to the provider


def test_provider_500_is_failed_with_status_and_body(project: Path, provider: Provider) -> None:
    (project / "scan.png").write_bytes(b"png")
    provider.mode = "500"
    result = run("vision.ocr", {"path": "scan.png"})
    details = result.details or {}
    assert result.code == "failed" and details["status"] == 500
    assert "model overloaded" in details["body"] and "500" in result.error


def test_provider_malformed_answer_names_the_field(project: Path, provider: Provider) -> None:
    (project / "scan.wav").write_bytes(b"wav")
    provider.mode = "malformed"
    result = run("audio.transcribe", {"path": "scan.wav"})
    assert result.code == "failed" and (result.details or {})["field"] == "text"
    assert "'text'" in result.error


def test_provider_slow_past_deadline_is_failed(project: Path, provider: Provider) -> None:
    (project / "scan.png").write_bytes(b"png")
    provider.mode = "slow"
    t0 = time.monotonic()
    result = run("vision.ocr", {"path": "scan.png"}, deadline_ms=700)
    assert result.code == "failed" and (result.details or {})["reason"] == "timeout"
    assert time.monotonic() - t0 < 2.5
