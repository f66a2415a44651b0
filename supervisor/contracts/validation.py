"""Turn msgspec validation errors into messages that name the JSON path and the bad value.

``Expected `int` >= 1 - at `$.pool.max``` on ``{"pool": {"max": "two"}}`` under prefix
``sidecars.utility`` becomes ``sidecars.utility.pool.max: expected int >= 1, got "two"``.
"""

from __future__ import annotations

import json
import re
import types
import typing
from typing import Any

import msgspec

_AT = re.compile(r"^(?P<msg>.*?) - at `\$(?P<path>[^`]*)`$", re.S)
_UNKNOWN = re.compile(r"^Object contains unknown field `(?P<field>[^`]*)`$")
_MISSING = re.compile(r"^Object missing required field `(?P<field>[^`]*)`$")
_GOT = re.compile(r", got `[^`]*`$")
_TOKEN = re.compile(r"\.([^.\[\]]+)|\[(\d+|\.\.\.)\]")
_MISSING_VALUE = object()
_PLAIN = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*$")


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


def key_path(prefix: str, key: str) -> str:
    """``prefix.key``, or ``prefix["a.b"]`` for a key that is not a plain name."""
    if not _PLAIN.match(key):
        return f"{prefix}[{json.dumps(key, ensure_ascii=False)}]"
    return f"{prefix}.{key}" if prefix else key


def _struct_type(tp: Any) -> type[msgspec.Struct] | None:
    return tp if isinstance(tp, type) and issubclass(tp, msgspec.Struct) else None


def _unwrap(tp: Any) -> Any:
    """``Annotated[X, ...]`` -> ``X``; ``X | None`` -> ``X`` when X is a struct."""
    if typing.get_origin(tp) is typing.Annotated:
        return typing.get_args(tp)[0]
    if isinstance(tp, types.UnionType) or typing.get_origin(tp) is typing.Union:
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1 and _struct_type(args[0]) is not None:
            return args[0]
    return tp


def struct_problems(raw: Any, struct: type[msgspec.Struct], prefix: str) -> list[str]:
    """Every validation problem of ``raw`` against ``struct``, one message per bad field.

    Nested structs (and ``dict[str, Struct]`` and ``list[Struct]`` members) are checked member
    by member; any other field is checked whole, so its message is msgspec's first for it.
    """
    if not isinstance(raw, dict):
        return _convert_problems(raw, struct, prefix)
    fields = {f.encode_name: f for f in msgspec.structs.fields(struct)}
    forbid = getattr(struct.__struct_config__, "forbid_unknown_fields", False)
    problems: list[str] = []
    for key, value in raw.items():
        path = key_path(prefix, str(key))
        field = fields.get(key)
        if field is None:
            if forbid:
                problems.append(f"{path}: unknown field")
            continue
        problems += _field_problems(value, field.type, path)
    for name, field in fields.items():
        if field.required and name not in raw:
            problems.append(f"{key_path(prefix, name)}: required field missing")
    return problems


def _field_problems(value: Any, tp: Any, path: str) -> list[str]:
    bare = _unwrap(tp)
    nested = _struct_type(bare)
    if nested is not None and isinstance(value, dict):
        return struct_problems(value, nested, path)
    if typing.get_origin(bare) is dict and isinstance(value, dict):
        _key_tp, value_tp = typing.get_args(bare)
        inner = _struct_type(_unwrap(value_tp))
        if inner is not None:
            problems: list[str] = []
            for k, v in value.items():
                problems += _field_problems(v, inner, key_path(path, str(k)))
            return problems
    if typing.get_origin(bare) is list and isinstance(value, list):
        (item_tp,) = typing.get_args(bare)
        inner = _struct_type(_unwrap(item_tp))
        if inner is not None:
            problems = []
            for i, v in enumerate(value):
                problems += _field_problems(v, inner, f"{path}[{i}]")
            return problems
    return _convert_problems(value, tp, path)


def _convert_problems(value: Any, tp: Any, path: str) -> list[str]:
    try:
        msgspec.convert(value, tp)
    except msgspec.ValidationError as exc:
        return [describe(exc, value, path)]
    except (ValueError, TypeError, RecursionError) as exc:  # a lone surrogate: UnicodeError
        return [f"{path}: cannot be used: {type(exc).__name__}"]
    return []


def all_problems(
    raw: Any, struct: type[msgspec.Struct], prefix: str, exc: msgspec.ValidationError
) -> list[str]:
    """Every problem of ``raw`` (``exc`` is msgspec's first), never fewer than one message."""
    try:
        found = struct_problems(raw, struct, prefix)
    except (RecursionError, TypeError, ValueError):
        found = []
    return found or [describe(exc, raw, prefix)]


def describe_all(tp: type[msgspec.Struct], raw: Any, prefix: str = "") -> list[str]:
    """Every problem of ``raw`` as a ``tp``, one line each; empty when ``raw`` converts."""
    try:
        msgspec.convert(raw, tp)
    except msgspec.ValidationError as exc:
        return all_problems(raw, tp, prefix, exc)
    return []
