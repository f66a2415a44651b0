"""``audio.speak`` delegate: ``espeak-ng -w <wav> --stdin`` (Debian ``espeak-ng``).

Input ``{text, path (absolute temp file the sidecar renames into place), voice?}``; answer
``{bytes, sampleRate, channels, seconds, voice, engine}``. espeak-ng writes 22,050 Hz mono WAV.
"""

from __future__ import annotations

import os
import wave
from typing import Any

from sidecars.media.delegates._oneshot import DelegateError, main, need_binary, run_engine


def speak(payload: dict[str, Any], _request: dict[str, Any]) -> dict[str, Any]:
    """Speak ``text`` into a WAV file with espeak-ng."""
    text, path = payload.get("text"), payload.get("path")
    if not isinstance(text, str) or not isinstance(path, str):
        raise DelegateError("input.text and input.path must be strings")
    voice = payload.get("voice")
    exe = need_binary("espeak-ng", "espeak-ng")
    argv = [exe, "-w", path]
    if voice:
        argv += ["-v", str(voice)]
    run_engine([*argv, "--stdin"], stdin=text.encode("utf-8"))
    with wave.open(path, "rb") as wav:
        rate, channels, frames = wav.getframerate(), wav.getnchannels(), wav.getnframes()
    return {
        "bytes": os.path.getsize(path),
        "sampleRate": rate,
        "channels": channels,
        "seconds": round(frames / rate, 3) if rate else 0.0,
        "voice": voice or "default",
        "engine": "espeak-ng",
    }


if __name__ == "__main__":
    main(speak)
