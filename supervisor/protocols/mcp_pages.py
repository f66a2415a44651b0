"""Cursor pagination of the MCP face's lists (``tools/list``, ``resources/list``,
``resources/templates/list``, ``prompts/list``): pure.

# Strategy: a cursor is self-contained (any replica can answer the next page, as the stateless
# era asks): URL-safe base64 of ``{"o": offset, "k": name}``, the offset of the page and the name
# of the last item before it. A list that changed between pages resumes right after that item
# when it is still listed (nothing skipped or repeated for an insertion or removal elsewhere),
# else at the offset. A cursor that does not decode is the client's error (``BadCursor``).
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Sequence
from typing import Any

import msgspec

PAGE_SIZE = 1000
"""Items per page of the face's lists."""


class BadCursor(ValueError):
    """A cursor this server did not give."""


class _Cursor(msgspec.Struct, kw_only=True):
    o: int
    k: str | None = None


def encode_cursor(offset: int, after: str | None) -> str:
    raw = msgspec.json.encode(_Cursor(o=offset, k=after))
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[int, str | None]:
    """``(offset, name of the item before the page)``.

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
    return c.o, c.k


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
        if after is not None:
            for i, item in enumerate(items):
                if isinstance(item, dict) and item.get(ident) == after:
                    start = i + 1
                    break
    size = max(1, size)
    chunk = list(items[start : start + size])
    if start + size >= len(items) or not chunk:
        return chunk, None
    last = chunk[-1]
    name = last.get(ident) if isinstance(last, dict) else None
    return chunk, encode_cursor(start + size, name if isinstance(name, str) else None)
