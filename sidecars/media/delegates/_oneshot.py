"""The oneshot delegate loop: one request on stdin, one answer line on stdout (PROTOCOL 3.2).

Standard library only. A handler returns the answer's fields or raises :class:`DelegateError`;
anything else it raises becomes ``failed`` with the exception text (and a non-zero exit).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from typing import Any

Handler = Callable[[dict[str, Any], dict[str, Any]], dict[str, Any]]


class DelegateError(Exception):
    """An answer with ``ok: false``.

    Args:
        message: Human text for the envelope's ``content``.
        code: ``failed``, ``unavailable`` or ``unsupported``.
        details: Extra answer fields for audit (exit code, stderr tail, engine).
    """

    def __init__(self, message: str, *, code: str = "failed", **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.details = details


def need_binary(name: str, package: str) -> str:
    """The path of engine ``name`` on PATH, or raise ``unavailable`` naming the package.

    Args:
        name: The executable (``tesseract``).
        package: The Debian package that provides it (``tesseract-ocr``).

    Returns:
        The executable's path.
    """
    found = shutil.which(name)
    if found is None:
        raise DelegateError(
            f"{name} is not installed (not found on PATH); install the Debian package {package}",
            code="unavailable",
            engine=name,
            hint=f"apt-get install {package}",
        )
    return found


def run_engine(
    argv: list[str], *, stdin: bytes | None = None
) -> subprocess.CompletedProcess[bytes]:
    """Run an engine to completion; a non-zero exit raises ``failed`` with the stderr tail.

    The delegate itself is killed (with its process group) by the sidecar on deadline, so no
    timeout is applied here.
    """
    proc = subprocess.run(argv, input=stdin, capture_output=True, check=False)
    if proc.returncode != 0:
        tail = proc.stderr.decode("utf-8", "replace")[-2000:]
        raise DelegateError(
            f"{argv[0]} exited with status {proc.returncode}: {tail.strip()[-300:]}",
            engine=argv[0],
            exitCode=proc.returncode,
            stderr=tail,
        )
    return proc


def main(handler: Handler) -> None:
    """Read the request, run ``handler(input, request)``, write the answer; exit 1 on failure."""
    try:
        request = json.loads(sys.stdin.readline() or "{}")
        if not isinstance(request, dict):
            raise DelegateError("request is not a JSON object")
        payload = request.get("input") or {}
        if not isinstance(payload, dict):
            raise DelegateError("request input is not a JSON object")
        answer: dict[str, Any] = {**handler(payload, request), "ok": True}
        status = 0
    except DelegateError as exc:
        answer = {**exc.details, "ok": False, "code": exc.code, "error": exc.message}
        status = 1
    except Exception as exc:
        answer = {"ok": False, "code": "failed", "error": f"{type(exc).__name__}: {exc}"}
        status = 1
    sys.stdout.write(json.dumps(answer) + "\n")
    sys.stdout.flush()
    sys.exit(status)
