"""The client side of ``mcp.adopt`` against hosts that will not adopt: an older host (it does
not know the method) and one that cannot (``unsupported``) keep the relay, with no descriptor
sent; a refusal (an unknown profile) reaches the caller with its code and message. Real Unix
sockets; the "host" is a listener that answers the one line an older or refusing host would."""

from __future__ import annotations

import json
import os
import pty
import socket

import pytest
import trio

from supervisor.mcp_face.handover import RELAY_ENV, Refused, Relay, hand_over, wants_relay


async def _host(
    path: str,
    answer: dict,
    seen: list,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    listener = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    await listener.bind(path)
    listener.listen(1)
    task_status.started()
    conn, _ = await listener.accept()
    with conn, listener:
        data = b""
        while b"\n" not in data:
            data += await conn.recv(4096)
        seen.append(json.loads(data))
        await conn.send(json.dumps({"id": 1, **answer}).encode() + b"\n")
        # What comes next: nothing (the client must not send its descriptors), then EOF.
        _msg, ancdata, _flags, _addr = await conn.recvmsg(16, socket.CMSG_SPACE(8))
        seen.append(ancdata)


@pytest.mark.parametrize(
    ("code", "outcome"),
    [("unknown-method", Relay), ("unsupported", Relay), ("invalid-params", Refused)],
)
async def test_hosts_that_do_not_adopt(tmp_path, code, outcome):
    path = str(tmp_path / "host.sock")
    seen: list = []
    error = {"error": {"code": code, "message": f"no ({code})"}}
    r, w = os.pipe()
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(_host, path, error, seen)
            with pytest.raises(outcome) as exc:
                await hand_over(path, {"profile": "p"}, stdin_fd=r, stdout_fd=w)
    finally:
        os.close(r)
        os.close(w)
    assert seen[0] == {"id": 1, "method": "mcp.adopt", "params": {"profile": "p"}}
    assert seen[1] == []  # no descriptor was sent
    if outcome is Refused:
        assert (exc.value.code, exc.value.message) == (code, f"no ({code})")


def test_wants_relay(tmp_path, monkeypatch):
    monkeypatch.delenv(RELAY_ENV, raising=False)
    r, w = os.pipe()
    a, b = socket.socketpair()
    plain = open(tmp_path / "f", "wb")  # noqa: SIM115 - closed below
    try:
        assert wants_relay(False, r, w) == ""
        assert wants_relay(False, a.fileno(), b.fileno()) == ""
        assert wants_relay(True, r, w) == "--relay"
        assert wants_relay(False, r, plain.fileno()) == "stdout is not a pipe or a socket"
        master, slave = pty.openpty()
        try:
            assert wants_relay(False, slave, w) == "stdin is not a pipe or a socket"
        finally:
            os.close(master)
            os.close(slave)
        monkeypatch.setenv(RELAY_ENV, "0")
        assert wants_relay(False, r, w) == ""
        monkeypatch.setenv(RELAY_ENV, "1")
        assert wants_relay(False, r, w) == f"{RELAY_ENV} is set"
    finally:
        plain.close()
        a.close()
        b.close()
        os.close(r)
        os.close(w)
