"""The media provider bridge: one HTTP JSON POST per call to ``config.providerUrl``.

Request body ``{"tool": <name>, "input": {...}, "file"?: {"name", "bytes", "base64"}}`` with the
``config.providerHeaders`` headers; the input file (``vision.*``, ``audio.transcribe``) travels
base64-encoded, at most ``config.maxInputBytes`` (default 25 MiB). The answer is a JSON object:
``vision.ocr`` and ``audio.transcribe`` need a string ``text``, ``audio.speak`` needs
``audioBase64`` (written by the sidecar), ``vision.analyze`` passes through as is. An HTTP error
is ``failed`` with the status and a body excerpt; a malformed answer is ``failed`` naming what
was wrong. Standard library only (``urllib``): one request per call, nothing to pool.
"""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sidecars.sdk import ToolError

DEFAULT_MAX_INPUT = 25 << 20
MAX_ANSWER = 64 << 20
EXCERPT = 500


def provider_headers(config: Mapping[str, Any]) -> dict[str, str]:
    """``config.providerHeaders`` as a header dict (non-string values refused)."""
    raw = config.get("providerHeaders") or {}
    if not isinstance(raw, Mapping) or not all(isinstance(v, str) for v in raw.values()):
        raise ToolError(
            "config.providerHeaders must map header names to strings",
            details={"reason": "bad-config"},
        )
    return dict(raw)


def encode_file(path: Path, shown: str, config: Mapping[str, Any]) -> dict[str, Any]:
    """The ``file`` member of a provider request, within ``config.maxInputBytes``."""
    limit = config.get("maxInputBytes", DEFAULT_MAX_INPUT)
    limit = limit if isinstance(limit, int) and limit > 0 else DEFAULT_MAX_INPUT
    size = path.stat().st_size
    if size > limit:
        raise ToolError(
            f"{shown!r} is {size} bytes, over the provider upload limit of {limit}",
            code="invalid-input",
            details={"path": shown, "reason": "too-large", "limit": limit},
        )
    data = path.read_bytes()
    return {"name": path.name, "bytes": size, "base64": base64.b64encode(data).decode("ascii")}


def call_provider(
    url: str, config: Mapping[str, Any], body: dict[str, Any], timeout_s: float
) -> dict[str, Any]:
    """POST ``body`` to the provider and return its JSON object answer.

    Raises:
        ToolError: ``failed`` with ``status`` and ``body`` excerpt for an HTTP error, with
            ``reason`` ``timeout``/``unreachable``/``bad-answer`` otherwise.
    """
    headers = {"Content-Type": "application/json", "Accept": "application/json"}
    headers.update(provider_headers(config))
    request = urllib.request.Request(
        url, data=json.dumps(body).encode("utf-8"), headers=headers, method="POST"
    )
    tool = body.get("tool")
    try:
        with urllib.request.urlopen(request, timeout=max(0.05, timeout_s)) as resp:
            status = resp.status
            raw = resp.read(MAX_ANSWER + 1)
    except urllib.error.HTTPError as exc:
        excerpt = exc.read(EXCERPT).decode("utf-8", "replace")
        raise ToolError(
            f"provider answered HTTP {exc.code} for {tool}: {excerpt[:200]}",
            details={"provider": url, "status": exc.code, "body": excerpt},
        ) from None
    except TimeoutError:
        raise ToolError(
            f"provider did not answer {tool} within {timeout_s:.1f} s",
            details={"provider": url, "reason": "timeout"},
        ) from None
    except (urllib.error.URLError, OSError) as exc:
        why = getattr(exc, "reason", exc)
        if isinstance(why, TimeoutError):
            raise ToolError(
                f"provider did not answer {tool} within {timeout_s:.1f} s",
                details={"provider": url, "reason": "timeout"},
            ) from None
        raise ToolError(
            f"provider {url} unreachable: {why}",
            details={"provider": url, "reason": "unreachable"},
        ) from None
    if len(raw) > MAX_ANSWER:
        raise ToolError(
            f"provider answer for {tool} is over {MAX_ANSWER} bytes",
            details={"provider": url, "status": status, "reason": "too-large"},
        )
    try:
        answer = json.loads(raw)
    except ValueError:
        raise ToolError(
            f"provider answer for {tool} is not JSON",
            details={
                "provider": url,
                "status": status,
                "reason": "bad-answer",
                "body": raw[:EXCERPT].decode("utf-8", "replace"),
            },
        ) from None
    if not isinstance(answer, dict):
        raise ToolError(
            f"provider answer for {tool} is not a JSON object",
            details={"provider": url, "status": status, "reason": "bad-answer"},
        )
    return answer


def require(answer: dict[str, Any], key: str, kind: type, tool: str, url: str) -> Any:
    """``answer[key]`` of type ``kind``, or ``failed`` naming the missing or mistyped field."""
    value = answer.get(key)
    if not isinstance(value, kind):
        raise ToolError(
            f"provider answer for {tool} lacks a {kind.__name__} {key!r}",
            details={"provider": url, "reason": "bad-answer", "field": key},
        )
    return value
