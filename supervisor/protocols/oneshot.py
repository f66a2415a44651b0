"""process-json, mode oneshot (PROTOCOL 3.2, the Flyflor convention) as sans-IO pieces.

# Strategy: one process per call. The host writes one request line to stdin and closes it; the
# first line on stdout is the answer, ``{"ok": true, ...fields}`` or
# ``{"ok": false, "code": ..., "error": ..., ...details}``. :class:`FirstLine` collects stdout
# until that line is complete (bounded), :func:`parse_answer` turns the line and the exit status
# into a :class:`CallOutcome`. A parsable answer wins over the exit status; without one a non-zero
# exit is ``failed`` (a death by signal is ``worker-crashed``), and a zero exit with no
# parsable answer is a ``protocol-error``.
"""

from __future__ import annotations

from typing import Any

import msgspec

from supervisor.contracts.wire import NULL, RESULT_CODES
from supervisor.protocols.errors import LineTooLong
from supervisor.protocols.outcome import CallOutcome, describe_status, preview, raw_json


class Request(msgspec.Struct, kw_only=True):
    """The single stdin line of a oneshot call."""

    tool: str
    input: msgspec.Raw
    config: dict[str, Any] = msgspec.field(default_factory=dict)
    cwd: str = ""
    projectDir: str = ""
    configDir: str = ""
    hostPrivate: list[str] = msgspec.field(default_factory=list)


_encode = msgspec.json.Encoder().encode


def request_line(
    tool: str,
    input_raw: msgspec.Raw,
    *,
    config: dict[str, Any],
    cwd: str,
    project_dir: str,
    config_dir: str,
    host_private: list[str] | None = None,
) -> bytes:
    """The bytes to write to a oneshot process's stdin (one line, newline-terminated)."""
    return (
        _encode(
            Request(
                tool=tool,
                input=input_raw,
                config=config,
                cwd=cwd,
                projectDir=project_dir,
                configDir=config_dir,
                hostPrivate=host_private or [],
            )
        )
        + b"\n"
    )


class FirstLine:
    """Collects stdout bytes until the first line is complete.

    Args:
        max_line: Longest answer accepted, in bytes (the output cap).
    """

    __slots__ = ("_buf", "line", "max_line")

    def __init__(self, max_line: int) -> None:
        self.max_line = max_line
        self._buf = bytearray()
        self.line: bytes | None = None

    @property
    def done(self) -> bool:
        return self.line is not None

    def feed(self, data: bytes) -> bytes | None:
        """Add ``data``; return the first line (without the newline) once it is complete.

        Raises:
            LineTooLong: The first line grew past ``max_line``.
        """
        if self.line is not None:
            return self.line
        buf = self._buf
        start = len(buf)
        buf += data
        nl = buf.find(b"\n", start)
        if nl >= 0:
            if nl > self.max_line:
                raise LineTooLong(f"answer line over the {self.max_line}-byte output cap")
            self.line = bytes(buf[:nl]).rstrip(b"\r")
            buf.clear()
            return self.line
        if len(buf) > self.max_line:
            raise LineTooLong(f"answer line over the {self.max_line}-byte output cap")
        return None

    def finish(self) -> bytes | None:
        """At end of stdout: the first line, or an unterminated last line, or None if empty."""
        if self.line is None and self._buf.strip():
            self.line = bytes(self._buf)
            self._buf.clear()
        return self.line


def parse_answer(tool: str, line: bytes | None, exit_code: int | None) -> CallOutcome:
    """Turn the first stdout line and the exit status into an answer.

    Args:
        tool: The tool called (for messages).
        line: The first stdout line (None: the process wrote none).
        exit_code: The exit status (negative: killed by that signal; None: unknown).
    """
    obj: Any = None
    if line is not None and line.strip():
        try:
            obj = msgspec.json.decode(line)
        except (msgspec.DecodeError, RecursionError):  # RecursionError: nested too deeply
            obj = None
    if isinstance(obj, dict) and isinstance(obj.get("ok"), bool):
        return _from_object(tool, obj)
    status = describe_status(exit_code)
    said = f"; stdout: {preview(line)}" if line else ""
    if exit_code is not None and exit_code < 0:
        return CallOutcome(
            ok=False,
            code="worker-crashed",
            error=f"{tool}: the process was {status} before it answered{said}",
        )
    if exit_code != 0:
        return CallOutcome(
            ok=False, code="failed", error=f"{tool}: {status} with no parsable answer{said}"
        )
    if not line:
        return CallOutcome(
            ok=False, code="protocol-error", error=f"{tool}: exited 0 without an answer"
        )
    return CallOutcome(
        ok=False,
        code="protocol-error",
        error=f"{tool}: the first stdout line is not a JSON object with a boolean ok{said}",
    )


def _from_object(tool: str, obj: dict[str, Any]) -> CallOutcome:
    fields = {k: v for k, v in obj.items() if k != "ok"}
    if obj["ok"]:
        content = fields.pop("content") if isinstance(fields.get("content"), str) else None
        if set(fields) == {"data"}:
            data = raw_json(fields["data"])
        else:
            data = raw_json(fields) if fields else NULL
        return CallOutcome(ok=True, data=data, content=content)
    code = fields.pop("code", None)
    error = fields.pop("error", None)
    data = raw_json(fields.pop("data")) if "data" in fields else NULL
    if not isinstance(code, str) or code not in RESULT_CODES:
        if code is not None:
            fields["sidecarCode"] = code
        code = "failed"
    if not isinstance(error, str) or not error:
        error = f"{tool} failed ({code})" if error is None else _encode(error).decode()
    return CallOutcome(ok=False, code=code, error=error, details=fields or None, data=data)
