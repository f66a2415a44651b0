"""Cursor pagination of the MCP face's lists (``tools/list``, ``resources/list``,
``resources/templates/list``, ``prompts/list``): pure.

# Strategy: a cursor is self-contained (any replica can answer the next page, as the stateless
# era asks): URL-safe base64 of ``{"o": offset, "k": [names]}``, the offset of the page and the
# names of the last items before it, nearest first (at most ``TRAIL``). A list that changed
# between pages resumes right after the nearest of those items still listed, so an insertion or
# a removal elsewhere, or of the last item seen itself, skips or repeats nothing; only when all of
# them are gone does the offset decide. A cursor that does not decode is the client's error
# (``BadCursor``).
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Sequence
from typing import Any

import msgspec

PAGE_SIZE = 1000
"""Items per page of the face's lists."""
TRAIL = 8
"""Names of the items before a page that its cursor carries."""


class BadCursor(ValueError):
    """A cursor this server did not give."""


class _Cursor(msgspec.Struct, kw_only=True):
    o: int
    k: list[str] | str | None = None
    """The trail; a single name (or none) in cursors of an earlier version, still honoured so a
    client paging across a rolling upgrade of replicas is not refused."""


def encode_cursor(offset: int, after: Sequence[str]) -> str:
    raw = msgspec.json.encode(_Cursor(o=offset, k=list(after[:TRAIL])))
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[int, list[str]]:
    """``(offset, names of the items before the page, nearest first)``.

    Raises:
        BadCursor: Not a cursor of ours.
    """
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        c = msgspec.json.decode(raw, type=_Cursor)
    except (binascii.Error, ValueError, msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise BadCursor(f"invalid cursor {cursor[:40]!r}") from exc
    if c.o < 0:
        raise BadCursor(f"invalid cursor {cursor[:40]!r}")
    return c.o, [c.k] if isinstance(c.k, str) else list(c.k or [])


def paginate(
    items: Sequence[Any], cursor: str | None, ident: str, size: int = PAGE_SIZE
) -> tuple[list[Any], str | None]:
    """The page of ``items`` (dicts named by their ``ident`` field) that ``cursor`` starts (None:
    the first), and the cursor of the next page (None: this was the last).

    Raises:
        BadCursor: ``cursor`` is not one of ours.
    """
    start = 0
    if cursor is not None:
        start, after = decode_cursor(cursor)
        if after:
            where = {_name(item, ident): i for i, item in enumerate(items)}
            for name in after:
                if name in where:
                    start = where[name] + 1
                    break
    size = max(1, size)
    chunk = list(items[start : start + size])
    if start + size >= len(items) or not chunk:
        return chunk, None
    trail = [n for n in (_name(i, ident) for i in reversed(chunk[-TRAIL:])) if n is not None]
    return chunk, encode_cursor(start + size, trail)


def _name(item: Any, ident: str) -> str | None:
    name = item.get(ident) if isinstance(item, dict) else None
    return name if isinstance(name, str) else None
