"""``audio.transcribe`` delegate: pocketsphinx (PyPI, ships its US English model).

Input ``{path (absolute WAV, 16-bit PCM, mono), lang?}``; answer ``{text, lang, sampleRate,
seconds, engine}``. The decoder runs at the file's own sample rate (no resampling: measured to
recognise more words on espeak-ng's 22,050 Hz output). Only English (``en``, ``en-us``) is
bundled; another language is ``unsupported`` (configure a provider for it).
"""

from __future__ import annotations

import wave
from typing import Any

from sidecars.media.delegates._oneshot import DelegateError, main

ENGLISH = {"en", "en-us", "eng"}


def transcribe(payload: dict[str, Any], _request: dict[str, Any]) -> dict[str, Any]:
    """Decode one WAV file to text."""
    path = payload.get("path")
    if not isinstance(path, str):
        raise DelegateError("input.path must be a string")
    lang = str(payload.get("lang") or "en-us").lower()
    if lang not in ENGLISH:
        raise DelegateError(
            f"the bundled pocketsphinx model is US English only, not {lang!r}",
            code="unsupported",
        )
    try:
        from pocketsphinx import Decoder
    except ImportError:
        raise DelegateError(
            "pocketsphinx is not installed; pip install pocketsphinx (toolhost extra 'media')",
            code="unavailable",
            engine="pocketsphinx",
        ) from None
    try:
        with wave.open(path, "rb") as wav:
            rate, width, channels = wav.getframerate(), wav.getsampwidth(), wav.getnchannels()
            frames = wav.readframes(wav.getnframes())
    except (wave.Error, EOFError) as exc:
        raise DelegateError(f"not a readable WAV file: {exc}", code="unsupported") from None
    if width != 2 or channels != 1:
        raise DelegateError(
            f"need 16-bit mono PCM WAV, got {8 * width}-bit with {channels} channel(s)",
            code="unsupported",
        )
    decoder = Decoder(samprate=rate, loglevel="FATAL")
    decoder.start_utt()
    decoder.process_raw(frames, full_utt=True)
    decoder.end_utt()
    hyp = decoder.hyp()
    return {
        "text": hyp.hypstr if hyp is not None else "",
        "lang": "en-us",
        "sampleRate": rate,
        "seconds": round(len(frames) / 2 / rate, 3) if rate else 0.0,
        "engine": "pocketsphinx",
    }


if __name__ == "__main__":
    main(transcribe)
