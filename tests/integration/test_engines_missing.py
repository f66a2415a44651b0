"""An engine a bundled sidecar imports, made unimportable on purpose, under a real host: the tools
that need it are unavailable before any call, with the import error and the package to install,
and the others keep working (issue 26, item 1).

The engine is shadowed by a path entry (``PYTHONPATH``) holding a module of the same name that
raises ImportError, as a missing or half-installed package does: ``lxml_html_clean`` gives the
exact failure of a stock pip 23 install (``lxml.html.clean module is now a separate project``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from supervisor.calls.call import InvokeRequest
from tests.conftest import REPO, effective, raw, running_host, wait_available, wait_for
from tests.sidecars.engines import need_binary, need_module

MANIFESTS = [str(REPO / "manifests")]
WEB_TOOLS = ["web.fetch", "web.extract", "web.download", "web.search"]
MEDIA_TOOLS = ["vision.analyze", "vision.ocr", "audio.transcribe", "audio.speak"]


def shadow(root: Path, *modules: str) -> str:
    """A folder whose packages ``modules`` raise ImportError when imported."""
    folder = root / "shadow"
    for module in modules:
        package = folder / module
        package.mkdir(parents=True)
        (package / "__init__.py").write_text(
            f"raise ImportError('{module} is shadowed by the test (not installed)')\n"
        )
    return str(folder)


def entry(module: str, tools: list[str], config: dict[str, Any], env: dict[str, str]) -> Any:
    return {
        "command": "python",
        "args": ["-m", module],
        "tools": tools,
        "config": config,
        "env": env,
        "pool": {"min": 1, "max": 1},
        "probe": {"intervalMs": 200},
    }


def probe_reason(host: Any, tool: str) -> Any:
    d = host.catalog.get(tool)
    if d is None or d.stability.probe != "unavailable":
        return None
    return next((r for r in d.stability.reasons if r.field == "probe"), None)


@pytest.mark.parametrize(
    ("hidden", "broken", "working"),
    [
        ("lxml_html_clean", ["web.fetch", "web.extract"], ["web.download"]),
        ("httpx", WEB_TOOLS, []),
    ],
)
async def test_web_engine_missing_is_unavailable_before_any_call(
    app: Path, tmp_path: Path, hidden: str, broken: list[str], working: list[str]
) -> None:
    need_module("httpx", "web")
    need_module("trafilatura", "web")
    (app / "page.html").write_text("<html><body><p>hello</p></body></html>")
    env = {"PYTHONPATH": shadow(tmp_path, hidden)}
    config = {"providers": [{"name": "p", "url": "http://127.0.0.1:9/search"}]}
    registry = {"web": entry("sidecars.web", WEB_TOOLS, config, env)}
    async with running_host(app, registry, manifest_dirs=MANIFESTS) as host:
        reasons = await wait_for(
            host,
            lambda: (
                all(probe_reason(host, t) for t in broken)
                and [probe_reason(host, t) for t in broken]
            ),
            what="the tools without their engine are unavailable",
        )
        for reason in reasons:
            assert reason.code == "engine-missing", reason
            assert hidden in reason.message and "ImportError" in reason.message, reason
            assert "pip install -e '.[web]'" in (reason.hint or ""), reason
        if working:
            await wait_available(host, *working)
        # The worker started and stays up: no crash loop, no per-call ImportError.
        assert all(effective(host, t) == "unavailable" for t in broken)
        env_ = await host.invoker.invoke(InvokeRequest("web.extract", raw({"path": "page.html"})))
        assert env_.status == "unavailable", env_
        assert hidden in env_.content and "Traceback" not in env_.content


async def test_media_engines_missing_are_unavailable_before_any_call(
    app: Path, tmp_path: Path
) -> None:
    need_module("PIL", "media")
    need_binary("espeak-ng", "espeak-ng")
    python_env = {"PYTHONPATH": shadow(tmp_path, "PIL", "pocketsphinx")}
    empty = tmp_path / "empty-path"
    empty.mkdir()

    def bundled(name: str, env: dict[str, str]) -> dict[str, Any]:
        return {"command": "python", "args": ["-m", f"sidecars.media.delegates.{name}"], "env": env}

    config = {
        "localCommands": {
            "vision.analyze": bundled("analyze", python_env),
            "audio.transcribe": bundled("transcribe", python_env),
            "vision.ocr": bundled("ocr", {"PATH": str(empty)}),  # tesseract not on its PATH
            "audio.speak": bundled("speak", {}),
        }
    }
    media = entry("sidecars.media", MEDIA_TOOLS, config, {})
    # The delegates' PYTHONPATH is the media sidecar's config, not its env: like an operator who
    # points a delegate at a folder of their own, the entry grants it (docs/confinement.md).
    media["confine"] = {"read": [python_env["PYTHONPATH"]]}
    registry = {"media": media}
    broken = {
        "vision.analyze": "PIL",
        "audio.transcribe": "pocketsphinx",
        "vision.ocr": "tesseract",
    }
    async with running_host(app, registry, manifest_dirs=MANIFESTS) as host:
        await wait_for(
            host,
            lambda: all(probe_reason(host, t) for t in broken),
            what="the delegates without their engine are unavailable",
        )
        for tool, engine in broken.items():
            reason = probe_reason(host, tool)
            assert reason.code == "engine-missing" and engine in reason.message, reason
        assert "Pillow" in (probe_reason(host, "vision.analyze").hint or "")
        assert "pocketsphinx" in (probe_reason(host, "audio.transcribe").hint or "")
        assert "tesseract-ocr" in (probe_reason(host, "vision.ocr").hint or "")
        await wait_available(host, "audio.speak")
        env = await host.invoker.invoke(InvokeRequest("vision.analyze", raw({"path": "x.png"})))
        assert env.status == "unavailable" and "PIL" in env.content, env
