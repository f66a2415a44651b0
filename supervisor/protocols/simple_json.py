"""simple-json (PROTOCOL 3.3, Fractalic's "Simple JSON" convention) as pure functions.

# Strategy: a simple-json tool is a script run once per call with the input JSON as its single
# argument; its whole stdout is the answer. Discovery runs it twice: with ``{"__test__": true}``
# (the answer must be JSON, in time) and with ``--fractalic-dump-schema`` (optional:
# ``{"description", "parameters"}``). These functions judge what those runs printed; the
# runtime runs the processes and measures time.
"""

from __future__ import annotations

from typing import Any

import msgspec

from supervisor.contracts.wire import NULL, ToolInfo
from supervisor.protocols.outcome import CallOutcome, describe_status, preview, raw_json

TEST_ARG = '{"__test__": true}'
"""The probe argument, byte for byte as Fractalic scripts compare it."""
DUMP_SCHEMA_ARG = "--fractalic-dump-schema"
DEFAULT_PROBE_TIMEOUT_MS = 200
ANY_OBJECT: dict[str, Any] = {"type": "object", "additionalProperties": True}


class ProbeVerdict(msgspec.Struct, frozen=True, kw_only=True):
    """The outcome of the ``{"__test__": true}`` run: passed, or a reason code and message."""

    ok: bool
    code: str = ""
    message: str = ""


def call_argv(argv: list[str], input_raw: bytes) -> list[str]:
    """The command line of one call: the script's argv plus the input JSON as one argument."""
    return [*argv, bytes(input_raw).decode("utf-8")]


def judge_probe(
    stdout: bytes, exit_code: int | None, *, timed_out: bool, timeout_ms: int
) -> ProbeVerdict:
    """Did the script answer the test argument with JSON in time?

    Args:
        stdout: Everything it printed.
        exit_code: Its exit status (None when it was killed at the deadline).
        timed_out: It did not finish within ``timeout_ms``.
        timeout_ms: The probe deadline, for the message.
    """
    if timed_out:
        return ProbeVerdict(
            ok=False,
            code="probe-timeout",
            message=f"no answer to the {TEST_ARG} probe within {timeout_ms} ms",
        )
    text = stdout.strip()
    if not text:
        return ProbeVerdict(
            ok=False,
            code="probe-failed" if exit_code else "probe-not-json",
            message=f"the {TEST_ARG} probe printed nothing ({describe_status(exit_code)})",
        )
    try:
        msgspec.json.decode(text)
    except (msgspec.DecodeError, RecursionError):  # RecursionError: nested too deeply
        return ProbeVerdict(
            ok=False,
            code="probe-not-json",
            message=f"the {TEST_ARG} probe printed something that is not JSON: {preview(text)}",
        )
    return ProbeVerdict(ok=True)


def tool_info(name: str, dump: bytes | None, fallback: str) -> ToolInfo:
    """The descriptor facts for ``name`` from a ``--fractalic-dump-schema`` answer.

    A missing or unusable dump gives ``fallback`` as the description and an open object schema.
    """
    obj: Any = None
    if dump and dump.strip():
        try:
            obj = msgspec.json.decode(dump.strip())
        except (msgspec.DecodeError, RecursionError):  # RecursionError: nested too deeply
            obj = None
    if not isinstance(obj, dict):
        return ToolInfo(name=name, description=fallback, inputSchema=dict(ANY_OBJECT))
    description = obj.get("description")
    schema = obj.get("parameters", obj.get("inputSchema"))
    if not isinstance(schema, dict) or schema.get("type", "object") != "object":
        schema = dict(ANY_OBJECT)
    return ToolInfo(
        name=name,
        description=description if isinstance(description, str) and description else fallback,
        inputSchema=schema,
    )


def parse_answer(tool: str, stdout: bytes, exit_code: int | None) -> CallOutcome:
    """One call's answer from the script's stdout and exit status.

    JSON is the answer; an object with an ``error`` member, or a non-zero exit, is ``failed``
    (the JSON kept as data). Plain text with exit 0 is accepted as the model's text (Fractalic
    scripts that print text still work); a death by signal is ``worker-crashed``.
    """
    text = stdout.strip()
    obj: Any = None
    parsed = False
    if text:
        try:
            obj = msgspec.json.decode(text)
            parsed = True
        except (msgspec.DecodeError, RecursionError):  # RecursionError: nested too deeply
            parsed = False
    status = describe_status(exit_code)
    if exit_code is not None and exit_code < 0:
        return CallOutcome(
            ok=False,
            code="worker-crashed",
            error=f"{tool}: the script was {status}",
            data=msgspec.Raw(text) if parsed else NULL,
        )
    if parsed and isinstance(obj, dict) and obj.get("error"):
        err = obj["error"]
        message = err if isinstance(err, str) else msgspec.json.encode(err).decode()
        rest = {k: v for k, v in obj.items() if k != "error"}
        return CallOutcome(
            ok=False,
            code="failed",
            error=message,
            data=raw_json(rest) if rest else NULL,
        )
    if exit_code != 0:
        said = "" if parsed or not text else f"; stdout: {preview(text)}"
        return CallOutcome(
            ok=False,
            code="failed",
            error=f"{tool}: the script ended with {status}{said}",
            data=msgspec.Raw(text) if parsed else NULL,
        )
    if parsed:
        return CallOutcome(ok=True, data=msgspec.Raw(text))
    if text:
        return CallOutcome(ok=True, content=text.decode("utf-8", "replace"))
    return CallOutcome(ok=True)
