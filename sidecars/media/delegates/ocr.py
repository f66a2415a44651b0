"""``vision.ocr`` delegate: ``tesseract <image> stdout -l <lang>`` (Debian ``tesseract-ocr``).

Input ``{path (absolute, confined by the sidecar), lang?}``; answer ``{text, lang, engine}``.
``lang`` is a tesseract language code (``eng`` by default; ``en`` is taken as ``eng``).
"""

from __future__ import annotations

from typing import Any

from sidecars.media.delegates._oneshot import DelegateError, main, need_binary, run_engine

LANG_ALIASES = {"en": "eng", "en-us": "eng", "en-gb": "eng", "de": "deu", "fr": "fra"}


def ocr(payload: dict[str, Any], _request: dict[str, Any]) -> dict[str, Any]:
    """Read the text in one image with tesseract."""
    path = payload.get("path")
    if not isinstance(path, str):
        raise DelegateError("input.path must be a string")
    lang = str(payload.get("lang") or "eng")
    lang = LANG_ALIASES.get(lang.lower(), lang)
    if not lang.replace("+", "").replace("_", "").isalnum():
        raise DelegateError(f"bad tesseract language code {lang!r}", code="unsupported")
    exe = need_binary("tesseract", "tesseract-ocr")
    proc = run_engine([exe, path, "stdout", "-l", lang])
    text = proc.stdout.decode("utf-8", "replace").strip()
    return {"text": text, "lang": lang, "engine": "tesseract"}


if __name__ == "__main__":
    main(ocr)
