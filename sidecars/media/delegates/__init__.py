"""The media sidecar's bundled delegates: one small oneshot process per call (PROTOCOL 3.2).

Each module runs as ``python -m sidecars.media.delegates.<name>``, reads one request line from
stdin and writes one answer line to stdout. They import only the standard library and their
engine (Pillow, pocketsphinx), never the SDK, so a call pays one interpreter start and the
engine. The media sidecar resolves and confines every path before it starts a delegate:
delegates receive absolute paths.
"""

ENGINES: dict[str, tuple[str, str, str]] = {
    "ocr": ("binary", "tesseract", "apt-get install tesseract-ocr"),
    "speak": ("binary", "espeak-ng", "apt-get install espeak-ng"),
    "transcribe": ("module", "pocketsphinx", "pip install -e '.[media]' (pocketsphinx)"),
    "analyze": ("module", "PIL", "pip install -e '.[media]' (Pillow)"),
}
"""Delegate name -> (kind, the executable or module it needs, what to install). The media sidecar
checks it before any call (``sidecars.media.runner.check_engine``)."""
