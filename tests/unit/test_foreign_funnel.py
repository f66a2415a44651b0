"""The result funnel holds for every foreign protocol: ``content`` is never empty and ``data``
survives a failure when the sidecar gave some."""

import msgspec
import pytest

from supervisor.contracts.wire import NULL
from supervisor.policy.results import from_answer
from supervisor.protocols import mcp, oneshot, simple_json


def mcp_answer(result):
    response = mcp.Response(
        id=1, method="tools/call", result=msgspec.Raw(msgspec.json.encode(result))
    )
    return mcp.call_answer(response)


CASES = [
    ("oneshot ok, nothing", oneshot.parse_answer("t", b'{"ok": true}', 0), False),
    (
        "oneshot ok:false, empty error",
        oneshot.parse_answer("t", b'{"ok": false, "error": ""}', 1),
        False,
    ),
    ("oneshot garbage", oneshot.parse_answer("t", b"zzz", 2), False),
    ("oneshot fail with data", oneshot.parse_answer("t", b'{"ok": false, "data": [1]}', 1), True),
    ("simple-json empty", simple_json.parse_answer("t", b"", 0), False),
    (
        "simple-json error with data",
        simple_json.parse_answer("t", b'{"error": "x", "n": 1}', 0),
        True,
    ),
    ("simple-json crash", simple_json.parse_answer("t", b"", -9), False),
    ("mcp empty text", mcp_answer({"content": [{"type": "text", "text": ""}]}), False),
    ("mcp nothing", mcp_answer({"content": []}), False),
    (
        "mcp isError no text",
        mcp_answer({"content": [{"type": "image", "data": "x"}], "isError": True}),
        True,
    ),
]


@pytest.mark.parametrize(("label", "answer", "has_data"), CASES, ids=[c[0] for c in CASES])
def test_content_never_empty_and_data_survives(label, answer, has_data):
    env = from_answer(
        "t",
        ok=answer.ok,
        data=answer.data,
        content=answer.content,
        code=answer.code,
        error=answer.error,
        details=answer.details,
        sidecar="s",
        pid=1,
        duration_ms=1.0,
        max_output_bytes=1 << 20,
    )
    assert env.content.strip(), label
    if has_data:
        assert env.data != NULL and msgspec.json.decode(env.data) is not None
    if not answer.ok:
        assert env.status in ("failed", "unavailable") and env.error.message
