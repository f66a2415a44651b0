"""The ``media`` sidecar: ``vision.analyze``, ``vision.ocr``, ``audio.transcribe``, ``audio.speak``.

A bridge, not an engine: each call goes to the tool's local delegate in
``config.localCommands`` (a oneshot process-json program, see :mod:`sidecars.media.runner`) or,
when the tool has none, to ``config.providerUrl`` (see :mod:`sidecars.media.provider`). A tool
with neither is ``unavailable`` in ``pong`` (before any call) and when called, with a hint.

Paths are relative to projectDir and confined to it (:func:`sidecars.sdk.paths.confine`).
Delegates receive absolute paths; ``audio.speak`` hands its delegate a temporary file beside the
target and renames it into place only on success, so a killed delegate or worker never leaves
half a file under the target name.
"""

from __future__ import annotations

import base64
import time
from pathlib import Path
from typing import Annotated, Any

import msgspec
from msgspec import Meta

from sidecars.media.provider import call_provider, encode_file, require
from sidecars.media.runner import (
    DEFAULT_TIMEOUT_MS,
    MARGIN_MS,
    DelegateSpec,
    check_engine,
    run_delegate,
)
from sidecars.sdk import Context, Reply, Sidecar, ToolError
from sidecars.sdk.paths import atomic_output, confine, project_relative
from supervisor.contracts import wire

app = Sidecar("media", version="1.0.0", concurrency=4)
"""The sidecar; ``app.run()`` serves it (see ``__main__``)."""

TOOLS = ("vision.analyze", "vision.ocr", "audio.transcribe", "audio.speak")
BUNDLED_HINT = (
    "run `toolhost init --add media` to register the bundled delegates (tesseract-ocr, "
    "espeak-ng, pocketsphinx, Pillow), or set config.providerUrl"
)


class AnalyzeInput(msgspec.Struct, forbid_unknown_fields=True):
    """An image to describe."""

    path: Annotated[str, Meta(description="Image file relative to the project directory.")]
    prompt: Annotated[
        str | None,
        Meta(description="Question for a vision provider; the bundled delegate reports facts."),
    ] = None


class OcrInput(msgspec.Struct, forbid_unknown_fields=True):
    """An image to read text from."""

    path: Annotated[str, Meta(description="Image file relative to the project directory.")]
    lang: Annotated[
        str | None, Meta(description="Language code (tesseract: eng, deu, ...); eng by default.")
    ] = None


class TranscribeInput(msgspec.Struct, forbid_unknown_fields=True):
    """An audio file to transcribe."""

    path: Annotated[str, Meta(description="Audio file (WAV) relative to the project directory.")]
    lang: Annotated[str | None, Meta(description="Language code; en-us by default.")] = None


class SpeakInput(msgspec.Struct, forbid_unknown_fields=True):
    """Text to speak into an audio file."""

    text: Annotated[str, Meta(min_length=1, description="The text to speak.")]
    path: Annotated[str, Meta(description="Output WAV file relative to the project directory.")]
    voice: Annotated[str | None, Meta(description="Voice name (espeak-ng: en, en-us, ...).")] = None
    overwrite: Annotated[bool, Meta(description="Replace an existing file.")] = False


# routing -------------------------------------------------------------------------------------


def _delegates(config: dict[str, Any]) -> dict[str, Any]:
    raw = config.get("localCommands") or {}
    if not isinstance(raw, dict):
        raise ToolError(
            "config.localCommands must be an object of tool name -> {command, args}",
            details={"reason": "bad-config"},
        )
    return raw


def route(tool: str, config: dict[str, Any]) -> DelegateSpec | str:
    """The tool's delegate, else the provider URL, else raise ``unavailable`` with a hint."""
    entry = _delegates(config).get(tool)
    if entry is not None:
        try:
            return DelegateSpec(tool, entry)
        except ValueError as exc:
            raise ToolError(str(exc), details={"reason": "bad-config"}) from None
    url = config.get("providerUrl")
    if isinstance(url, str) and url.startswith(("http://", "https://")):
        return url
    raise ToolError(
        f"{tool} has no delegate in config.localCommands and no config.providerUrl",
        code="unavailable",
        details={"reason": "not-configured", "hint": BUNDLED_HINT},
    )


def _timeout_s(ctx: Context) -> float:
    if ctx.deadline_ms > 0:
        left = ctx.deadline_ms - (time.monotonic() - ctx.started) * 1000.0 - MARGIN_MS
        return max(0.05, left / 1000.0)
    return DEFAULT_TIMEOUT_MS / 1000.0


def _read_tool(tool: str, path_arg: str, payload: dict[str, Any], ctx: Context) -> dict[str, Any]:
    """Shared path of the three tools that read one input file."""
    target = route(tool, ctx.config)
    path = confine(ctx.project_dir, path_arg, must_exist=True, kind="file")
    shown = project_relative(ctx.project_dir, path)
    if isinstance(target, DelegateSpec):
        data = run_delegate(target, tool, {**payload, "path": str(path)}, ctx)
        return {**data, "path": shown, "via": "delegate"}
    body = {"tool": tool, "input": payload, "file": encode_file(path, path_arg, ctx.config)}
    answer = call_provider(target, ctx.config, body, _timeout_s(ctx))
    if tool != "vision.analyze":
        require(answer, "text", str, tool, target)
    return {**answer, "path": shown, "via": "provider"}


# tools ---------------------------------------------------------------------------------------


@app.tool(
    "vision.analyze",
    description=(
        "Describe an image file in the project: size, format, dominant colours and EXIF from the "
        "bundled delegate, or a vision provider's answer to `prompt` when one is configured."
    ),
    read_only=True,
    concurrency_safe=True,
    permission="read",
)
def vision_analyze(args: AnalyzeInput, ctx: Context) -> Reply:
    """Image facts (delegate) or a provider's analysis."""
    payload: dict[str, Any] = {"prompt": args.prompt} if args.prompt else {}
    data = _read_tool("vision.analyze", args.path, payload, ctx)
    text = data.get("text") or data.get("description")
    if not isinstance(text, str):
        size = f"{data.get('width')}x{data.get('height')}"
        colors = ", ".join(c.get("hex", "?") for c in data.get("dominantColors", [])[:3])
        text = f"{data['path']}: {data.get('format')} {size} {data.get('mode')}; colours {colors}"
    return Reply(data=data, content=text)


@app.tool(
    "vision.ocr",
    description="Read the text in an image file in the project (OCR).",
    read_only=True,
    concurrency_safe=True,
    permission="read",
)
def vision_ocr(args: OcrInput, ctx: Context) -> Reply:
    """OCR through tesseract (delegate) or a provider."""
    payload: dict[str, Any] = {"lang": args.lang} if args.lang else {}
    data = _read_tool("vision.ocr", args.path, payload, ctx)
    text = data.get("text")
    return Reply(data=data, content=text if isinstance(text, str) and text else "(no text)")


@app.tool(
    "audio.transcribe",
    description="Transcribe speech in an audio file (WAV) in the project to text.",
    read_only=True,
    concurrency_safe=True,
    permission="read",
)
def audio_transcribe(args: TranscribeInput, ctx: Context) -> Reply:
    """Speech to text through pocketsphinx (delegate) or a provider."""
    payload: dict[str, Any] = {"lang": args.lang} if args.lang else {}
    data = _read_tool("audio.transcribe", args.path, payload, ctx)
    text = data.get("text")
    return Reply(data=data, content=text if isinstance(text, str) and text else "(no speech)")


@app.tool(
    "audio.speak",
    description="Speak text into a WAV file in the project (text to speech).",
    concurrency_safe=True,
    permission="write",
)
def audio_speak(args: SpeakInput, ctx: Context) -> Reply:
    """Text to speech through espeak-ng (delegate) or a provider; written atomically."""
    target = route("audio.speak", ctx.config)
    path = confine(ctx.project_dir, args.path, must_exist=False)
    if path.exists() and not args.overwrite:
        raise ToolError(
            f"output {args.path!r} exists; pass overwrite to replace it",
            code="invalid-input",
            details={"path": args.path, "reason": "exists"},
        )
    if path.is_dir():
        raise ToolError(
            f"output {args.path!r} is a directory",
            code="invalid-input",
            details={"path": args.path, "reason": "not-a-file"},
        )
    payload: dict[str, Any] = {"text": args.text}
    if args.voice:
        payload["voice"] = args.voice
    with atomic_output(path, suffix=".wav") as tmp:
        if isinstance(target, DelegateSpec):
            data = run_delegate(target, "audio.speak", {**payload, "path": str(tmp)}, ctx)
            via = "delegate"
        else:
            answer = call_provider(
                target, ctx.config, {"tool": "audio.speak", "input": payload}, _timeout_s(ctx)
            )
            audio = require(answer, "audioBase64", str, "audio.speak", target)
            try:
                blob = base64.b64decode(audio, validate=True)
            except ValueError:
                raise ToolError(
                    "provider answer for audio.speak has invalid base64 in 'audioBase64'",
                    details={"provider": target, "reason": "bad-answer", "field": "audioBase64"},
                ) from None
            Path(tmp).write_bytes(blob)
            data = {k: v for k, v in answer.items() if k != "audioBase64"}
            via = "provider"
        if Path(tmp).stat().st_size == 0:
            raise ToolError(f"the {via} wrote no audio", details={"reason": "empty-output"})
    shown = project_relative(ctx.project_dir, path)
    data = {**data, "path": shown, "bytes": path.stat().st_size, "via": via}
    return Reply(data=data, content=f"wrote {shown} ({data['bytes']} bytes)")


# health --------------------------------------------------------------------------------------


@app.health
def health(sidecar: Sidecar) -> dict[str, wire.ToolHealth]:
    """Per-tool status for ``pong``: what each tool would be routed to, and whether it exists."""
    out: dict[str, wire.ToolHealth] = {}
    for tool in TOOLS:
        try:
            target = route(tool, sidecar.config)
            if isinstance(target, DelegateSpec):
                check_engine(target, target.resolve(sidecar.cwd), sidecar.sidecar_id)
        except ToolError as exc:
            details = exc.details or {}
            out[tool] = wire.ToolHealth(
                status="unavailable",
                reason=exc.message,
                hint=details.get("hint") or "fix the media sidecar's config",
                code=details.get("reason"),
            )
    return out
