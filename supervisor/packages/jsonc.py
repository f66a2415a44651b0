"""Edit one sidecar entry of a JSONC/JSON5 registry text, keeping everything else as written.

# Strategy: a small scanner walks the JSON5 text (comments, single- or double-quoted strings,
# bare keys, trailing commas) far enough to find where ``sidecars.<id>``'s value starts and ends,
# and the new entry is spliced in there, indented like its neighbours, so the operator's comments
# and layout survive. Correctness does not depend on the scanner: the edited text is parsed again
# with ``json5`` and must equal the intended document exactly; if it does not (or the scanner
# gave up), the whole document is written as plain JSON instead.
"""

from __future__ import annotations

import json
from typing import Any

import json5

_WS = " \t\r\n\ufeff\u00a0\u2028\u2029\v\f"
_DELIMS = set(",:]}[{\"'/") | set(_WS)

HEADER = (
    "// toolhost registry (schemaVersion 2). Rewritten by `toolhost pkg`; see docs/packages.md.\n"
)


class _Scan:
    """Just enough of a JSON5 reader to report value spans."""

    def __init__(self, text: str) -> None:
        self.t = text
        self.i = 0

    def skip(self) -> None:
        t, n = self.t, len(self.t)
        while self.i < n:
            c = t[self.i]
            if c in _WS:
                self.i += 1
            elif t.startswith("//", self.i):
                j = t.find("\n", self.i)
                self.i = n if j < 0 else j + 1
            elif t.startswith("/*", self.i):
                j = t.find("*/", self.i + 2)
                if j < 0:
                    raise ValueError("unterminated comment")
                self.i = j + 2
            else:
                return

    def peek(self) -> str:
        self.skip()
        return self.t[self.i] if self.i < len(self.t) else ""

    def string(self) -> str:
        t = self.t
        quote = t[self.i]
        j = self.i + 1
        while j < len(t):
            c = t[j]
            if c == "\\":
                j += 2
                continue
            if c == quote:
                raw = t[self.i : j + 1]
                self.i = j + 1
                value = json5.loads(raw)
                assert isinstance(value, str)
                return value
            j += 1
        raise ValueError("unterminated string")

    def bare(self) -> str:
        j = self.i
        while j < len(self.t) and self.t[j] not in _DELIMS:
            j += 1
        if j == self.i:
            raise ValueError(f"unexpected {self.t[self.i : self.i + 1]!r} at {self.i}")
        word, self.i = self.t[self.i : j], j
        return word

    def key(self) -> str:
        c = self.peek()
        return self.string() if c in "\"'" else self.bare()

    def value(self) -> tuple[int, int]:
        """Skip one value; returns its span."""
        c = self.peek()
        start = self.i
        if c == "{":
            self.members(lambda k, s, e: None)
        elif c == "[":
            self.i += 1
            while self.peek() != "]":
                self.value()
                if self.peek() == ",":
                    self.i += 1
                elif self.peek() != "]":
                    raise ValueError(f"expected , or ] at {self.i}")
            self.i += 1
        elif c in "\"'":
            self.string()
        elif c:
            self.bare()
        else:
            raise ValueError("unexpected end of text")
        return start, self.i

    def members(self, on_member: Any) -> tuple[int, int]:
        """Walk an object at the cursor, calling ``on_member(key, start, end)`` per value."""
        start = self.i
        if self.peek() != "{":
            raise ValueError(f"expected an object at {self.i}")
        self.i += 1
        while self.peek() != "}":
            k = self.key()
            if self.peek() != ":":
                raise ValueError(f"expected : after {k!r}")
            self.i += 1
            self.skip()
            vs, ve = self.value()
            on_member(k, vs, ve)
            if self.peek() == ",":
                self.i += 1
            elif self.peek() != "}":
                raise ValueError(f"expected , or }} at {self.i}")
        self.i += 1
        return start, self.i


def _object_spans(text: str, start: int) -> tuple[tuple[int, int], dict[str, tuple[int, int]]]:
    scan = _Scan(text)
    scan.i = start
    spans: dict[str, tuple[int, int]] = {}
    whole = scan.members(lambda k, s, e: spans.__setitem__(k, (s, e)))
    return whole, spans


def _line_indent(text: str, pos: int) -> str:
    line_start = text.rfind("\n", 0, pos) + 1
    j = line_start
    while j < len(text) and text[j] in " \t":
        j += 1
    return text[line_start:j]


def _scalar(value: Any) -> bool:
    return not isinstance(value, dict | list)


def _render(value: Any, indent: str) -> str:
    """JSON for ``value`` starting at column ``indent``: short flat lists and objects inline."""
    if _scalar(value):
        return json.dumps(value, ensure_ascii=False)
    if not value:
        return "{}" if isinstance(value, dict) else "[]"
    inner = indent + "  "
    if isinstance(value, list):
        if all(_scalar(v) for v in value):
            flat = "[" + ", ".join(_render(v, inner) for v in value) + "]"
            if len(indent) + len(flat) <= 90:
                return flat
        return "[\n" + ",\n".join(inner + _render(v, inner) for v in value) + f"\n{indent}]"
    pairs = [f"{json.dumps(k, ensure_ascii=False)}: {_render(v, inner)}" for k, v in value.items()]
    if len(indent) > 4 and all(_scalar(v) for v in value.values()):
        flat = "{ " + ", ".join(pairs) + " }"
        if len(indent) + len(flat) <= 90:
            return flat
    return "{\n" + ",\n".join(inner + p for p in pairs) + f"\n{indent}}}"


def _splice(text: str, sid: str, entry: dict[str, Any]) -> str:
    scan = _Scan(text)
    scan.skip()
    _, top = _object_spans(text, scan.i)
    if "sidecars" not in top:
        raise ValueError("no sidecars object")
    sc_start, _ = top["sidecars"]
    (obj_start, obj_end), members = _object_spans(text, sc_start)
    if sid in members:
        vs, ve = members[sid]
        return text[:vs] + _render(entry, _line_indent(text, vs)) + text[ve:]
    key = json.dumps(sid)
    if members:
        last_end = max(e for _, e in members.values())
        indent = _line_indent(text, min(s for s, _ in members.values()))
        scan = _Scan(text)
        scan.i = last_end
        if scan.peek() == ",":
            last_end = scan.i + 1
            sep = ""
        else:
            sep = ","
        insert = f"{sep}\n{indent}{key}: {_render(entry, indent)}"
        if sep == "":
            insert += ","
        return text[:last_end] + insert + text[last_end:]
    outer = _line_indent(text, obj_start)
    inner = outer + "  "
    body = f"{{\n{inner}{key}: {_render(entry, inner)}\n{outer}}}"
    return text[:obj_start] + body + text[obj_end:]


def set_sidecar(text: str | None, sid: str, entry: dict[str, Any]) -> tuple[str, bool]:
    """The registry text with ``sidecars.<sid>`` set to ``entry``.

    Args:
        text: The current registry text (None: no file yet).
        sid: The sidecar id.
        entry: The complete new entry.

    Returns:
        ``(new_text, preserved)``: ``preserved`` is False when the document had to be rewritten
        as plain JSON (comments lost) because an in-place edit was not provably correct.

    Raises:
        ValueError: ``text`` is not valid JSONC with an object at the top.
    """
    if text is None or not text.strip():
        doc: dict[str, Any] = {"schemaVersion": 2, "sidecars": {sid: entry}}
        return HEADER + _render(doc, "") + "\n", False
    current = json5.loads(text)
    if not isinstance(current, dict):
        raise ValueError("the registry's top level is not an object")
    expected = dict(current)
    old = expected.get("sidecars")
    sidecars = dict(old) if isinstance(old, dict) else {}
    sidecars[sid] = entry
    expected["sidecars"] = sidecars
    try:
        new = _splice(text, sid, entry)
        if json5.loads(new) == expected:
            return new, True
    except (ValueError, IndexError, AssertionError):
        pass
    expected.setdefault("schemaVersion", 2)
    return HEADER + _render(expected, "") + "\n", False
