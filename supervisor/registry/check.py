"""Checks that make registry loading total: every problem reported, with its JSON path, nothing
raised.

# Strategy: three passes guard the loader. Before parsing, :func:`nesting_problem` scans the raw
# text (strings and comments skipped) for brackets nested deeper than :data:`MAX_DEPTH`, so the
# recursive JSON5 parser never sees a document that would exhaust the stack. After parsing,
# :func:`value_problems` walks the data iteratively and reports what JSON cannot mean but JSON5
# lets through (NaN, Infinity, integers beyond 64 bits). When msgspec refuses a struct (it stops
# at the first error), :func:`~supervisor.contracts.validation.struct_problems` validates
# field by field, descending into nested structs, so an entry with three mistakes gets three
# messages.
"""

from __future__ import annotations

import math
from typing import Any

import msgspec

from supervisor.contracts.registry import ConfineConfig, NetworkGrant
from supervisor.contracts.validation import all_problems, key_path, struct_problems
from supervisor.policy.egress import parse_rule

MAX_DEPTH = 64
"""Deepest nesting of objects and arrays accepted in a registry file (real ones use < 8)."""
INT_MIN, INT_MAX = -(2**63), 2**63 - 1


def nesting_problem(text: str, limit: int = MAX_DEPTH) -> str | None:
    """A message when ``text`` nests ``{``/``[`` deeper than ``limit`` (JSON5 lexical rules)."""
    depth = 0
    i, n = 0, len(text)
    line = 1
    while i < n:
        c = text[i]
        if c == "\n":
            line += 1
        elif c in "[{":
            depth += 1
            if depth > limit:
                return f"nested deeper than {limit} levels (line {line})"
        elif c in "]}":
            depth -= 1
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c:
                if text[j] == "\\":
                    j += 1
                elif text[j] == "\n":
                    line += 1
                j += 1
            i = j
        elif c == "/" and text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
            continue
        elif c == "/" and text.startswith("/*", i):
            j = text.find("*/", i + 2)
            end = n if j < 0 else j + 2
            line += text.count("\n", i, end)
            i = end
            continue
        i += 1
    return None


def value_problems(value: Any, prefix: str) -> list[str]:
    """Non-finite floats, out-of-range integers and over-deep nesting inside ``value``."""
    problems: list[str] = []
    stack: list[tuple[Any, str, int]] = [(value, prefix, 0)]
    while stack:
        node, path, depth = stack.pop()
        where = path or "$"
        if isinstance(node, bool):
            continue
        if isinstance(node, float) and not math.isfinite(node):
            shown = "NaN" if math.isnan(node) else ("Infinity" if node > 0 else "-Infinity")
            problems.append(f"{where}: {shown} is not a number (JSON has no NaN or Infinity)")
        elif isinstance(node, int) and not INT_MIN <= node <= INT_MAX:
            digits = len(str(abs(node)))
            problems.append(f"{where}: number with {digits} digits is out of the 64-bit range")
        elif isinstance(node, str):
            if _has_lone_surrogate(node):
                problems.append(f"{where}: string contains an unpaired UTF-16 surrogate escape")
        elif isinstance(node, dict | list):
            if isinstance(node, dict):
                for key in node:
                    if isinstance(key, str) and _has_lone_surrogate(key):
                        problems.append(
                            f"{where}: a key contains an unpaired UTF-16 surrogate escape"
                        )
            if depth >= MAX_DEPTH:
                problems.append(f"{where}: nested deeper than {MAX_DEPTH} levels")
                continue
            items = node.items() if isinstance(node, dict) else enumerate(node)
            children = [
                (v, key_path(path, str(k)) if isinstance(node, dict) else f"{path}[{k}]", depth + 1)
                for k, v in items
            ]
            stack.extend(reversed(children))
    return problems


def _has_lone_surrogate(text: str) -> bool:
    return any("\ud800" <= c <= "\udfff" for c in text)


def join_surrogates(value: Any) -> Any:
    """``value`` with escaped UTF-16 surrogate pairs (``"\\ud83d\\ude00"``, which json5 leaves
    as two code points) joined into one character; unpaired ones stay for
    :func:`value_problems` to report."""

    def fix(text: str) -> str:
        if not _has_lone_surrogate(text):
            return text
        try:
            return text.encode("utf-16", "surrogatepass").decode("utf-16")
        except UnicodeDecodeError:
            return text

    if isinstance(value, str):
        return fix(value)
    stack: list[Any] = [value]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            items = list(node.items())
            node.clear()
            for k, v in items:
                v = fix(v) if isinstance(v, str) else v
                node[fix(k) if isinstance(k, str) else k] = v
                stack.append(v)
        elif isinstance(node, list):
            for i, v in enumerate(node):
                if isinstance(v, str):
                    node[i] = fix(v)
                else:
                    stack.append(v)
    return value


def checked(
    raw: Any, struct: type[msgspec.Struct], prefix: str
) -> tuple[msgspec.Struct | None, list[str]]:
    """``raw`` converted to ``struct`` and every problem found on the way.

    The value pass (NaN, Infinity, huge integers, surrogates) and the field-by-field pass both
    run, so an entry with a NaN in one field and a wrong type in another gets both messages; a
    field the value pass already named is not named again by the struct pass. The converted
    value is returned when msgspec accepts ``raw`` (even with value problems, so callers can
    still run their semantic checks); it must not be used when problems is non-empty.
    """
    values = value_problems(raw, prefix)
    try:
        return msgspec.convert(raw, struct), values
    except msgspec.ValidationError as exc:
        found = all_problems(raw, struct, prefix, exc)
    except (ValueError, TypeError, RecursionError) as exc:  # a lone surrogate: UnicodeError
        found = struct_problems(raw, struct, prefix) or [
            f"{prefix or '$'}: cannot be used: {type(exc).__name__}"
        ]
    return None, values + [p for p in found if not _covered(p, values)]


def _covered(problem: str, values: list[str]) -> bool:
    """True when ``problem`` is about a path (or a path inside one) a value problem names."""
    for value in values:
        path = value.partition(": ")[0]
        if problem.startswith((path + ":", path + ".", path + "[")):
            return True
    return False


def every_problem(registry: Any, known: Any) -> list[str]:
    """One line per problem of a loaded registry and manifest catalog (for the host's log)."""
    lines = [*registry.errors, *known.errors]
    for entry in registry.sidecars.values():
        lines += entry.errors
        lines += entry.warnings
    return lines


def confine_problems(confine: ConfineConfig | None, prefix: str) -> list[str]:
    """What a ``confine`` profile (PROTOCOL 7) cannot mean, one message per problem with its
    JSON path: an egress rule that does not parse, a path with a NUL byte or a ``~`` (never
    expanded), a ``folders`` entry that is not a name, a process limit of 0 (the struct
    refuses it)."""
    if confine is None:
        return []
    problems: list[str] = []
    for key in ("read", "write", "unix"):
        paths = getattr(confine, key)
        if not isinstance(paths, list):
            continue
        for i, path in enumerate(paths):
            where = f"{prefix}.{key}[{i}]"
            if "\0" in path:
                problems.append(f"{where}: a path cannot hold a NUL byte")
            elif path.startswith("~"):
                problems.append(
                    f"{where}: {path!r}: ~ is not expanded; write the path relative to appRoot"
                    " or absolute"
                )
    folders = confine.folders if isinstance(confine.folders, list) else []
    for i, path in enumerate(folders):
        if "\0" in path or "/" in path or path in (".", ".."):
            problems.append(
                f"{prefix}.folders[{i}]: {path!r}: the name of a folder at the top of projectDir"
            )
    network = confine.network
    if isinstance(network, NetworkGrant):
        for i, rule in enumerate(network.allow):
            parsed = parse_rule(rule)
            if isinstance(parsed, str):
                problems.append(f"{prefix}.network.allow[{i}]: {parsed}")
        if len(set(network.loopback)) != len(network.loopback):
            problems.append(f"{prefix}.network.loopback: a port is listed twice")
    return problems
