"""Turn msgspec validation errors into messages that name the JSON path and the bad value.

``Expected `int` >= 1 - at `$.pool.max``` on ``{"pool": {"max": "two"}}`` under prefix
``sidecars.utility`` becomes ``sidecars.utility.pool.max: expected int >= 1, got "two"``.
"""

from __future__ import annotations

import json
import re
from typing import Any

import msgspec

_AT = re.compile(r"^(?P<msg>.*?) - at `\$(?P<path>[^`]*)`$", re.S)
_UNKNOWN = re.compile(r"^Object contains unknown field `(?P<field>[^`]*)`$")
_MISSING = re.compile(r"^Object missing required field `(?P<field>[^`]*)`$")
_GOT = re.compile(r", got `[^`]*`$")
_TOKEN = re.compile(r"\.([^.\[\]]+)|\[(\d+|\.\.\.)\]")
_MISSING_VALUE = object()


def _walk(raw: Any, path: str) -> Any:
    node = raw
    for m in _TOKEN.finditer(path):
        key, index = m.group(1), m.group(2)
        if key is not None:
            if not isinstance(node, dict) or key not in node:
                return _MISSING_VALUE
            node = node[key]
        elif index == "...":
            return _MISSING_VALUE
        else:
            i = int(index)
            if not isinstance(node, list) or i >= len(node):
                return _MISSING_VALUE
            node = node[i]
    return node


def _show(value: Any, limit: int = 60) -> str:
    # json.dumps (not msgspec) so NaN and Infinity show as themselves, not as null.
    try:
        text = json.dumps(value, ensure_ascii=False, allow_nan=True, default=repr)
    except (TypeError, ValueError, RecursionError):
        text = f"a {type(value).__name__}"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _join(prefix: str, path: str) -> str:
    if not prefix:
        return path.lstrip(".") or "$"
    return prefix + path if path else prefix


def describe(exc: msgspec.ValidationError, raw: Any, prefix: str = "") -> str:
    """A one-line message naming the JSON path (under ``prefix``) and the offending value."""
    text = str(exc)
    path = ""
    m = _AT.match(text)
    if m:
        text, path = m.group("msg"), m.group("path")
    m = _UNKNOWN.match(text)
    if m:
        return f"{_join(prefix, path + '.' + m.group('field'))}: unknown field"
    m = _MISSING.match(text)
    if m:
        return f"{_join(prefix, path + '.' + m.group('field'))}: required field missing"
    value = _walk(raw, path)
    if text.startswith("Invalid enum value"):
        shown = _show(value) if value is not _MISSING_VALUE else text.split(" ", 3)[-1]
        return f"{_join(prefix, path)}: invalid value {shown}"
    message = _GOT.sub("", text).replace("`", "")
    message = message[:1].lower() + message[1:]
    if value is not _MISSING_VALUE:
        message += f", got {_show(value)}"
    return f"{_join(prefix, path)}: {message}"


def describe_all(tp: Any, raw: Any, prefix: str = "") -> list[str]:
    """Every problem of ``raw`` as a ``tp`` (one line each, as :func:`describe` words them).

    msgspec stops at the first error; for a Struct given an object this checks each field on
    its own (unknown keys, required fields missing, each present value against its type,
    nested Structs the same way), so one refusal can name everything that is wrong. Empty when
    ``raw`` converts.
    """
    try:
        msgspec.convert(raw, tp)
    except msgspec.ValidationError as exc:
        first = exc
    else:
        return []
    if not (isinstance(tp, type) and issubclass(tp, msgspec.Struct) and isinstance(raw, dict)):
        return [describe(first, raw, prefix)]
    fields = msgspec.structs.fields(tp)
    known = {f.encode_name for f in fields}
    problems: list[str] = []
    forbid = getattr(tp.__struct_config__, "forbid_unknown_fields", False)
    if forbid:
        problems += [f"{_join(prefix, '.' + str(k))}: unknown field" for k in raw if k not in known]
    for f in fields:
        path = _join(prefix, "." + f.encode_name)
        if f.encode_name not in raw:
            if f.required:
                problems.append(f"{path}: required field missing")
            continue
        problems += describe_all(f.type, raw[f.encode_name], path)
    return problems or [describe(first, raw, prefix)]
