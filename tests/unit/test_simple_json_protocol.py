"""simple-json, pure: judging the probe, reading the schema dump, parsing call answers."""

import msgspec
import pytest

from supervisor.protocols.simple_json import (
    ANY_OBJECT,
    TEST_ARG,
    call_argv,
    judge_probe,
    parse_answer,
    tool_info,
)


def test_the_probe_argument_is_byte_for_byte_fractalic():
    assert TEST_ARG == '{"__test__": true}'


def test_call_argv_appends_the_input_as_one_argument():
    assert call_argv(["/py", "/s.py"], b'{"a": "\xc3\xa9 x"}') == ["/py", "/s.py", '{"a": "é x"}']


@pytest.mark.parametrize(
    ("stdout", "rc", "timed_out", "ok", "code", "fragment"),
    [
        (b'{"success": true, "_simple": true}\n', 0, False, True, "", ""),
        (b'{"error": "bad input"}\n', 1, False, True, "", ""),  # JSON is enough (Fractalic)
        (b"", None, True, False, "probe-timeout", "within 200 ms"),
        (b"hello there", 0, False, False, "probe-not-json", "not JSON: 'hello there'"),
        (b"", 0, False, False, "probe-not-json", "printed nothing (exit status 0)"),
        (b"", 2, False, False, "probe-failed", "printed nothing (exit status 2)"),
    ],
)
def test_judge_probe(stdout, rc, timed_out, ok, code, fragment):
    v = judge_probe(stdout, rc, timed_out=timed_out, timeout_ms=200)
    assert (v.ok, v.code) == (ok, code)
    assert fragment in v.message


def test_tool_info_from_dump_and_fallbacks():
    dump = b'{"description": "Weather", "parameters": {"type": "object", "required": ["lat"]}}'
    info = tool_info("weather", dump, "fallback")
    assert info.description == "Weather" and info.inputSchema["required"] == ["lat"]
    assert tool_info("w", None, "fb").description == "fb"
    assert tool_info("w", b"not json", "fb").inputSchema == ANY_OBJECT
    odd = tool_info("w", b'{"description": "", "parameters": {"type": "array"}}', "fb")
    assert odd.description == "fb" and odd.inputSchema == ANY_OBJECT
    alt = tool_info("w", b'{"inputSchema": {"type": "object", "properties": {}}}', "fb")
    assert alt.inputSchema == {"type": "object", "properties": {}}


def dec(raw):
    return msgspec.json.decode(raw)


@pytest.mark.parametrize(
    ("stdout", "rc", "ok", "code", "error", "data", "content"),
    [
        (b'{"result": "success"}\n', 0, True, None, None, {"result": "success"}, None),
        (b"[1, 2]", 0, True, None, None, [1, 2], None),
        (b"plain text answer\n", 0, True, None, None, None, "plain text answer"),
        (b"", 0, True, None, None, None, None),
        (b'{"error": "Unknown action: x"}', 0, False, "failed", "Unknown action: x", None, None),
        (b'{"error": "bad", "partial": 1}', 1, False, "failed", "bad", {"partial": 1}, None),
        (b'{"error": {"why": 1}}', 1, False, "failed", '{"why":1}', None, None),
        (b'{"n": 1}', 3, False, "failed", "t: the script ended with exit status 3", {"n": 1}, None),
        (
            b"Traceback",
            1,
            False,
            "failed",
            "t: the script ended with exit status 1; stdout: 'Traceback'",
            None,
            None,
        ),
        (b"", -9, False, "worker-crashed", "t: the script was killed by SIGKILL", None, None),
    ],
)
def test_parse_answer(stdout, rc, ok, code, error, data, content):
    a = parse_answer("t", stdout, rc)
    assert (a.ok, a.code, a.error, dec(a.data), a.content) == (ok, code, error, data, content)
