"""The result funnel: content never empty, data kept on failure, truncation with a marker."""

import msgspec
import pytest

from supervisor.contracts.wire import NULL
from supervisor.policy import results


def answer(**kw):
    base = dict(
        ok=True,
        data=NULL,
        content=None,
        code=None,
        error=None,
        details=None,
        sidecar="s",
        pid=1,
        duration_ms=1.0,
        max_output_bytes=0,
    )
    base.update(kw)
    return results.from_answer("t.x", **base)


def test_success_content_defaults_to_data_text():
    env = answer(data=msgspec.Raw(b'{"a":1}'))
    assert env.status == "success" and env.content == '{"a":1}' and env.error is None


def test_success_without_output_still_has_content():
    assert answer().content == "t.x succeeded with no output"


@pytest.mark.parametrize(
    ("code", "status"),
    [
        ("failed", "failed"),
        ("invalid-input", "failed"),
        ("cancelled", "failed"),
        ("unavailable", "unavailable"),
        ("unsupported", "unavailable"),
        (None, "failed"),
    ],
)
def test_failure_statuses(code, status):
    env = answer(ok=False, code=code, error="boom", data=msgspec.Raw(b'{"partial":true}'))
    assert env.status == status
    assert env.content == "boom"
    assert env.error.code == (code or "failed")
    assert bytes(env.data) == b'{"partial":true}'  # data survives a failure


def test_failure_without_message():
    env = answer(ok=False, code="failed", error=None)
    assert env.content == "t.x failed (failed)"


def test_truncation_marks_and_keeps_within_limit():
    big = msgspec.Raw(msgspec.json.encode({"blob": "x" * 5000}))
    env = answer(data=big, max_output_bytes=1000)
    assert env.meta.truncated is True
    assert "truncated by toolhost" in env.content
    assert env.data == NULL
    body = env.content.split("\n[... truncated")[0]
    assert len(body.encode()) <= 1000


def test_under_limit_untouched():
    env = answer(data=msgspec.Raw(b'{"a":1}'), content="ok", max_output_bytes=1000)
    assert env.meta.truncated is False and bytes(env.data) == b'{"a":1}'


def test_content_preview_is_bounded_for_big_data():
    big = msgspec.Raw(msgspec.json.encode("y" * 100_000))
    env = answer(data=big)
    assert len(env.content) < 20_000 and "bytes in all" in env.content
    assert bytes(env.data) == bytes(big)


def test_unavailable_refusal():
    env = results.unavailable("t.x", "quota-limited", "slow down", details={"retryAfterMs": 5})
    assert env.status == "unavailable" and env.meta.attempts == 0
    assert env.error.details == {"retryAfterMs": 5}


def test_json_no_client_can_read_is_withheld_saying_why():
    """A number past a double passes the host's scan (the data stays JSON text) but no
    msgspec, Go or serde client can decode the frame holding it: withheld, on success and on
    failure alike; a big integer and a tiny number are readable and kept."""
    env = answer(data=msgspec.Raw(b'{"x": [1, 1e400]}'))
    assert env.status == "failed" and env.data is NULL
    assert env.error is not None and env.error.code == "protocol-error"
    assert "Number out of range" in env.error.message and "withheld" in env.content
    env = answer(ok=False, data=msgspec.Raw(b"[1e400]"), code="quota-exceeded", error="too much")
    assert env.status == "failed" and env.data is NULL  # a failure keeps its own error
    assert env.error is not None and (env.error.code, env.error.message) == (
        "quota-exceeded",
        "too much",
    )
    assert env.content.startswith("too much\n[t.x answered JSON its clients cannot read")
    for raw in (b'{"n": 1000000000000000000000000000000}', b"-1E-400", b'"\\u0000"'):
        env = answer(data=msgspec.Raw(raw))
        assert env.status == "success" and bytes(env.data) == raw
    assert results.unreadable(msgspec.Raw(b"[1e400]")) is not None
    assert results.unreadable(msgspec.Raw(b"[1e300]")) is None
    big = msgspec.Raw(b"[" + b"1e400," * (results.CHECKED_BYTES // 6 + 1) + b"0]")
    assert results.unreadable(big) is None  # over the checked size: passed as written
