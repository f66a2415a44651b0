"""process-json oneshot, sans-IO: the request line, the first-line reader, answer parsing."""

import msgspec
import pytest

from supervisor.protocols.errors import LineTooLong
from supervisor.protocols.oneshot import FirstLine, parse_answer, request_line


def test_request_line_is_one_flyflor_request():
    line = request_line(
        "fly.echo",
        msgspec.Raw(b'{"a": 1}'),
        config={"k": "v"},
        cwd="/app",
        project_dir="/app/p",
        config_dir="/cfg",
        host_private=["/app/.toolhost"],
    )
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert msgspec.json.decode(line) == {
        "tool": "fly.echo",
        "input": {"a": 1},
        "config": {"k": "v"},
        "cwd": "/app",
        "projectDir": "/app/p",
        "configDir": "/cfg",
        "hostPrivate": ["/app/.toolhost"],
    }


ANSWER = b'{"ok": true, "x": 1}\n{"ok": false}\n'


@pytest.mark.parametrize("mode", ["whole", "bytes", "split"])
def test_first_line_any_chunking_ignores_what_follows(mode):
    fl = FirstLine(1000)
    got = None
    if mode == "whole":
        got = fl.feed(ANSWER)
    elif mode == "bytes":
        for i in range(len(ANSWER)):
            got = fl.feed(ANSWER[i : i + 1]) or got
    else:
        assert fl.feed(ANSWER[:5]) is None
        got = fl.feed(ANSWER[5:])
    assert got == b'{"ok": true, "x": 1}' and fl.done
    assert fl.feed(b"more") == got and fl.finish() == got


def test_first_line_unterminated_and_empty_and_crlf():
    fl = FirstLine(100)
    assert fl.feed(b'{"ok": true}') is None
    assert fl.finish() == b'{"ok": true}'
    assert FirstLine(100).finish() is None
    fl = FirstLine(100)
    assert fl.feed(b"  \n") == b"  "  # a blank first line is still the first line
    fl = FirstLine(100)
    assert fl.feed(b'{"ok": true}\r\n') == b'{"ok": true}'


def test_first_line_cap():
    with pytest.raises(LineTooLong):
        FirstLine(10).feed(b"x" * 11)
    with pytest.raises(LineTooLong):
        FirstLine(10).feed(b"x" * 20 + b"\n")
    assert FirstLine(10).feed(b"x" * 10 + b"\n") == b"x" * 10


def dec(raw):
    return msgspec.json.decode(raw)


@pytest.mark.parametrize(
    ("line", "rc", "ok", "code", "error", "data", "content", "details"),
    [
        (b'{"ok": true, "a": 1}', 0, True, None, None, {"a": 1}, None, None),
        (b'{"ok": true, "data": [1, 2]}', 0, True, None, None, [1, 2], None, None),
        (b'{"ok": true, "content": "hi", "a": 1}', 0, True, None, None, {"a": 1}, "hi", None),
        (b'{"ok": true}', 0, True, None, None, None, None, None),
        (b'{"ok": true, "a": 1}', 3, True, None, None, {"a": 1}, None, None),  # answer wins
        (
            b'{"ok": false, "code": "unavailable", "error": "no key", "provider": "x"}',
            1,
            False,
            "unavailable",
            "no key",
            None,
            None,
            {"provider": "x"},
        ),
        (
            b'{"ok": false, "code": "unsupported", "error": "nope", "data": {"p": 1}}',
            1,
            False,
            "unsupported",
            "nope",
            {"p": 1},
            None,
            None,
        ),
        (
            b'{"ok": false, "code": "exploded", "error": "bang"}',
            1,
            False,
            "failed",
            "bang",
            None,
            None,
            {"sidecarCode": "exploded"},
        ),
        (b'{"ok": false}', 1, False, "failed", "t failed (failed)", None, None, None),
    ],
)
def test_parse_parsable_answers(line, rc, ok, code, error, data, content, details):
    a = parse_answer("t", line, rc)
    assert (a.ok, a.code, a.error, dec(a.data), a.content, a.details) == (
        ok,
        code,
        error,
        data,
        content,
        details,
    )


@pytest.mark.parametrize(
    ("line", "rc", "code", "fragment"),
    [
        (b"garbage", 2, "failed", "exit status 2 with no parsable answer; stdout: 'garbage'"),
        (None, 1, "failed", "exit status 1 with no parsable answer"),
        (b'{"ok": "yes"}', 1, "failed", "no parsable answer"),
        (None, -9, "worker-crashed", "killed by SIGKILL before it answered"),
        (None, 0, "protocol-error", "exited 0 without an answer"),
        (b"[1, 2]", 0, "protocol-error", "not a JSON object with a boolean ok"),
        (None, None, "failed", "still running"),
    ],
)
def test_parse_unparsable_answers(line, rc, code, fragment):
    a = parse_answer("t", line, rc)
    assert not a.ok and a.code == code and fragment in a.error
