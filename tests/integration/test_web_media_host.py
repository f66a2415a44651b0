"""The web and media sidecars under a real host: pong-reported unavailability, the worker's
memory while a 200 MB body is refused, a download killed mid-stream, and a crashing delegate
that leaves the sidecar serving."""

from __future__ import annotations

from pathlib import Path

import msgspec
import psutil
import trio

from supervisor.calls.call import InvokeRequest
from tests.conftest import (
    REPO,
    effective,
    free_port,
    raw,
    running_host,
    wait_available,
    wait_for,
)
from tests.sidecars.engines import need_module
from tests.sidecars.webserver import web_server

MANIFESTS = [str(REPO / "manifests")]


def sidecar(module: str, tools: list[str], config: dict) -> dict:
    return {
        "command": "python",
        "args": ["-m", module],
        "tools": tools,
        "config": config,
        "pool": {"min": 1, "max": 1},
        "probe": {"intervalMs": 200},
        "restart": {"backoffMs": 20, "maxBackoffMs": 200},
    }


WEB_TOOLS = ["web.fetch", "web.extract", "web.download", "web.search"]
MEDIA_TOOLS = ["vision.analyze", "vision.ocr", "audio.transcribe", "audio.speak"]


async def test_web_worker_memory_and_killed_download(app: Path, project: Path) -> None:
    need_module("httpx", "web")
    with web_server() as base:
        web = sidecar("sidecars.web", WEB_TOOLS, {"allowPrivate": True})
        # Confined, web reaches the network only through the host's egress proxy, which opens a
        # loopback server only to a rule naming its address (as an operator writes it).
        port = base.rsplit(":", 1)[1].split("/", 1)[0]
        web["confine"] = {"network": {"allow": [f"127.0.0.1:{port}"]}}
        registry = {"web": web}
        confined = {"confinement": "best-effort"}
        async with running_host(app, registry, manifest_dirs=MANIFESTS, host=confined) as host:
            await wait_available(host, "web.fetch", "web.download")
            # No providers: web.search is unavailable before any call, with the hint.
            await wait_for(host, lambda: effective(host, "web.search") == "unavailable")
            reasons = host.catalog.get("web.search").stability.reasons
            assert any("config.providers" in r.hint for r in reasons), reasons

            env = await host.invoker.invoke(
                InvokeRequest("web.fetch", raw({"url": f"{base}/page"}))
            )
            assert env.status == "success", env
            # Another loopback port is not granted: the proxy refuses it, naming the rule.
            other = free_port()
            env = await host.invoker.invoke(
                InvokeRequest("web.fetch", raw({"url": f"http://127.0.0.1:{other}/"}))
            )
            assert env.status == "failed" and env.error.code == "destination-refused", env
            assert env.error.details["by"] == "egress-proxy"
            assert "confine.network.allow" in env.error.message, env.error.message
            worker = psutil.Process(env.meta.pid)
            before = worker.memory_info().rss
            env = await host.invoker.invoke(
                InvokeRequest("web.fetch", raw({"url": f"{base}/huge"}), timeout_ms=60_000)
            )
            assert env.status == "failed" and env.error.details["reason"] == "too-large"
            grown = worker.memory_info().rss - before
            assert grown < 48 << 20, f"worker grew {grown >> 20} MiB on a refused 200 MB body"

            # A download killed mid-stream leaves nothing under the target name.
            outcome: dict = {}

            async def download() -> None:
                outcome["env"] = await host.invoker.invoke(
                    InvokeRequest(
                        "web.download",
                        raw({"url": f"{base}/trickle", "path": "dl/big.bin"}),
                        timeout_ms=60_000,
                    )
                )

            async with trio.open_nursery() as nursery:
                nursery.start_soon(download)
                with trio.fail_after(20):
                    while not any(
                        p.stat().st_size > 0 for p in (project / "dl").glob(".big.bin.*")
                    ):
                        await trio.sleep(0.05)
                worker.kill()
            assert outcome["env"].status == "failed"
            assert outcome["env"].error.code == "worker-crashed", outcome["env"]
            assert not (project / "dl" / "big.bin").exists()


async def test_media_unconfigured_tools_and_a_crashing_delegate(app: Path, project: Path) -> None:
    need_module("PIL", "media")
    from PIL import Image

    Image.new("RGB", (64, 32), (0, 128, 0)).save(project / "green.png")
    config = {
        "localCommands": {
            "vision.analyze": {
                "command": "python",
                "args": ["-m", "sidecars.media.delegates.analyze"],
            },
            "vision.ocr": {"command": "python", "args": ["-c", "import os; os.abort()"]},
        }
    }
    registry = {"media": sidecar("sidecars.media", MEDIA_TOOLS, config)}
    async with running_host(app, registry, manifest_dirs=MANIFESTS) as host:
        await wait_available(host, "vision.analyze", "vision.ocr")
        await wait_for(host, lambda: effective(host, "audio.speak") == "unavailable")
        reasons = host.catalog.get("audio.speak").stability.reasons
        assert any("toolhost init --add media" in r.hint for r in reasons), reasons
        env = await host.invoker.invoke(InvokeRequest("vision.ocr", raw({"path": "green.png"})))
        assert env.status == "failed" and env.error.details["reason"] == "delegate-crashed"
        assert env.error.details["exitCode"] < 0  # killed by SIGABRT
        env = await host.invoker.invoke(InvokeRequest("vision.analyze", raw({"path": "green.png"})))
        assert env.status == "success", env
        data = msgspec.json.decode(env.data)
        assert (data["width"], data["height"]) == (64, 32)
        assert data["dominantColors"][0]["hex"] == "#008000"
