"""Cursor pagination of the MCP face's lists (``protocols/mcp_pages.py``)."""

import pytest

from supervisor.protocols.mcp_pages import BadCursor, decode_cursor, encode_cursor, paginate


def items(*names: str) -> list[dict]:
    return [{"name": n} for n in names]


def walk(listed: list[dict], size: int) -> list[str]:
    seen: list[str] = []
    cursor = None
    for _ in range(100):
        page, cursor = paginate(listed, cursor, "name", size)
        seen += [i["name"] for i in page]
        if cursor is None:
            return seen
    raise AssertionError("pagination did not end")


def test_pages_cover_the_list_once_in_order():
    listed = items(*"abcdefg")
    assert walk(listed, 3) == list("abcdefg")
    assert walk(listed, 7) == list("abcdefg")
    assert walk(listed, 100) == list("abcdefg")
    page, cursor = paginate(listed, None, "name", 7)
    assert len(page) == 7 and cursor is None
    assert paginate([], None, "name", 3) == ([], None)


def test_a_list_that_changed_between_pages_resumes_after_the_last_item_seen():
    first, cursor = paginate(items(*"abcdef"), None, "name", 2)
    assert [i["name"] for i in first] == ["a", "b"] and cursor is not None
    # An item inserted before the cursor shifts the offsets; the page still starts after "b".
    page, _ = paginate(items("0", *"abcdef"), cursor, "name", 2)
    assert [i["name"] for i in page] == ["c", "d"]
    # "b" itself gone: the page starts after "a", the nearest item seen that is still listed.
    page, _ = paginate(items("a", *"cdef"), cursor, "name", 2)
    assert [i["name"] for i in page] == ["c", "d"]
    # Every item seen gone: the offset is the fallback (the list as it is now, from index 2).
    page, _ = paginate(items(*"cdefg"), cursor, "name", 2)
    assert [i["name"] for i in page] == ["e", "f"]


def test_the_trail_is_bounded_and_nearest_first():
    listed = items(*[f"t{i:02}" for i in range(30)])
    _, cursor = paginate(listed, None, "name", 20)
    assert cursor is not None
    offset, after = decode_cursor(cursor)
    assert offset == 20 and after == [f"t{i:02}" for i in range(19, 11, -1)]
    # The last three seen removed, and one new item inserted at the front: nothing is skipped.
    changed = items("new", *[f"t{i:02}" for i in range(30) if i not in (17, 18, 19)])
    page, _ = paginate(changed, cursor, "name", 20)
    assert page[0]["name"] == "t20"


def test_a_cursor_is_self_contained_and_a_foreign_one_is_refused():
    assert decode_cursor(encode_cursor(5, ["x", "w"])) == (5, ["x", "w"])
    # A cursor of the earlier format (one name) from a replica not yet upgraded still works.
    assert decode_cursor("eyJvIjozLCJrIjoiYyJ9") == (3, ["c"])
    for bad in ["", "not base64 !", encode_cursor(-1, []), "eyJ4IjoxfQ"]:
        with pytest.raises(BadCursor):
            decode_cursor(bad)
    with pytest.raises(BadCursor):
        paginate(items("a"), "garbage!", "name", 1)
