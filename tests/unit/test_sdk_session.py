"""The SDK's sans-IO session and line splitter (``sidecars.sdk.session``, ``sidecars.sdk.stdio``):
host lines in, driver actions and protocol lines out, no IO and no trio."""

from __future__ import annotations

import json
import threading
from typing import Any

import msgspec
import pytest

from sidecars.sdk.session import Session
from sidecars.sdk.stdio import LineBuffer
from supervisor.contracts import wire


class Recorder:
    """A driver that records what the session asked of it."""

    def __init__(self) -> None:
        self.actions: list[tuple[str, Any]] = []
        self.flags: dict[int, threading.Event] = {}

    def call(self, call: wire.CallMessage, cancelled: threading.Event) -> None:
        self.actions.append(("call", call.id))
        self.flags[call.id] = cancelled

    def ping(self, ping_id: str) -> None:
        self.actions.append(("ping", ping_id))

    def cancelled(self, call_id: int) -> None:
        self.actions.append(("cancelled", call_id))


class Waiter:
    def __init__(self) -> None:
        self.responses: list[wire.Response] = []

    def wake(self, response: wire.Response) -> None:
        self.responses.append(response)


def make() -> tuple[Session, list[dict[str, Any]], list[tuple[str, str]], Recorder]:
    sent: list[dict[str, Any]] = []
    logged: list[tuple[str, str]] = []

    def write(data: bytes) -> None:
        assert data.endswith(b"\n") and data.count(b"\n") == 1
        sent.append(json.loads(data))

    return Session(write, lambda level, msg: logged.append((level, msg))), sent, logged, Recorder()


def line(**msg: Any) -> bytes:
    return json.dumps(msg).encode() + b"\n"


@pytest.mark.parametrize(
    ("msg", "actions", "goes_on"),
    [
        ({"type": "call", "id": 1, "tool": "t"}, [("call", 1)], True),
        ({"type": "ping", "id": "p"}, [("ping", "p")], True),
        ({"type": "cancel", "id": 9}, [], True),  # nothing in flight: nothing to do
        ({"type": "response", "id": "s9", "result": {}}, [], True),  # nobody waits: dropped
        ({"type": "shutdown"}, [], False),
        (
            {"type": "init", "sidecar": "x", "projectDir": "/", "configDir": "/", "cwd": "/"},
            [],
            True,
        ),
    ],
)
def test_each_host_message_becomes_one_driver_action(
    msg: dict[str, Any], actions: list[tuple[str, Any]], goes_on: bool
) -> None:
    session, sent, logged, driver = make()
    assert session.dispatch(line(**msg), driver) is goes_on
    assert driver.actions == actions
    assert sent == [] and logged == []


def test_a_bad_line_is_logged_and_the_loop_goes_on() -> None:
    session, sent, logged, driver = make()
    assert session.dispatch(b"not json\n", driver) is True
    assert session.dispatch(line(type="nonsense"), driver) is True
    assert [level for level, _ in logged] == ["error", "error"]
    assert logged[0][1].startswith("bad message from host: ")
    assert sent == [] and driver.actions == []


def test_every_call_is_answered_exactly_once() -> None:
    session, sent, _, driver = make()
    for i in (1, 2, 3):
        session.dispatch(line(type="call", id=i, tool="t"), driver)
    session.answer(wire.Result(id=1, ok=True))
    session.dispatch(line(type="cancel", id=2), driver)
    assert driver.flags[2].is_set() and not driver.flags[3].is_set()
    session.answer(wire.Result(id=2, ok=True))  # cancelled first: this answer is dropped
    session.dispatch(line(type="cancel", id=1), driver)  # answered first: nothing to cancel
    session.close()
    assert driver.flags[3].is_set()
    session.answer(wire.Result(id=3, ok=True))  # closed first
    assert [(m["id"], m["ok"], m.get("error")) for m in sent] == [
        (1, True, None),
        (2, False, "call cancelled"),
        (3, False, "sidecar shutting down"),
    ]
    assert {m.get("code") for m in sent[1:]} == {"cancelled"}
    assert ("cancelled", 2) in driver.actions and ("cancelled", 1) not in driver.actions


def test_requests_are_numbered_and_woken_by_their_response() -> None:
    session, sent, _, driver = make()
    first, second = Waiter(), Waiter()
    assert session.request(7, "state.get", {"key": "k"}, first) == "s1"
    assert session.request(7, "vault.get", {"key": "v"}, second) == "s2"
    assert sent == [
        {
            "type": "request",
            "id": "s1",
            "callId": 7,
            "method": "state.get",
            "params": {"key": "k"},
        },
        {
            "type": "request",
            "id": "s2",
            "callId": 7,
            "method": "vault.get",
            "params": {"key": "v"},
        },
    ]
    session.dispatch(line(type="response", id="s2", result={"value": 1}), driver)
    assert isinstance(second.responses[0].result, msgspec.Raw)
    assert msgspec.json.decode(second.responses[0].result) == {"value": 1}
    assert first.responses == []
    session.forget("s1")
    session.dispatch(line(type="response", id="s1", result={}), driver)  # forgotten: dropped
    assert first.responses == []


def test_close_wakes_every_request_with_host_gone_before_answering_calls() -> None:
    session, sent, _, driver = make()
    session.dispatch(line(type="call", id=1, tool="t"), driver)
    waiter = Waiter()
    session.request(1, "tools.invoke", {}, waiter)
    session.close()
    (response,) = waiter.responses
    assert response.id == "s1" and response.error is not None
    assert (response.error.code, response.error.message) == (
        "host-gone",
        "the host closed the connection",
    )
    assert sent[-1]["type"] == "result" and sent[-1]["code"] == "cancelled"


def test_progress_and_send_write_one_line_each() -> None:
    session, sent, _, _ = make()
    session.progress(4, {"step": 1})
    session.send(wire.Pong(id="p"))
    assert sent == [
        {"type": "progress", "id": 4, "data": {"step": 1}},
        {"type": "pong", "id": "p", "status": "healthy", "tools": {}},
    ]


def _split(chunks: list[bytes]) -> tuple[list[bytes], bytes]:
    buffer = LineBuffer()
    lines: list[bytes] = []
    for chunk in chunks:
        buffer.feed(chunk)
        while (got := buffer.next_line()) is not None:
            lines.append(got)
    return lines, buffer.take()


@pytest.mark.parametrize("how", ["whole", "byte by byte", "in two"])
def test_lines_split_the_same_however_the_bytes_arrive(how: str) -> None:
    data = b'{"a":1}\n\n{"b":2}\n{"tail"'
    chunks = {
        "whole": [data],
        "byte by byte": [data[i : i + 1] for i in range(len(data))],
        "in two": [data[:10], data[10:]],
    }[how]
    assert _split(chunks) == ([b'{"a":1}\n', b"\n", b'{"b":2}\n'], b'{"tail"')
