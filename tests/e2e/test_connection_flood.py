"""A flood of client connections against a host with a small open-file limit (issue 12): the
host caps connections, answers the rest ``overloaded``, and keeps serving everyone it took."""

import json
import socket

import trio

from supervisor.client import open_client
from tests.conftest import echo, write_registry
from tests.e2e.conftest import serve

NOFILE = 128  # the cap becomes 64 connections


def read_line(s: socket.socket) -> dict:
    buf = b""
    while not buf.endswith(b"\n"):
        chunk = s.recv(65536)
        if not chunk:
            raise EOFError(buf)
        buf += chunk
    return json.loads(buf)


async def test_more_connections_than_fit_under_a_small_nofile_limit(tmp_path):
    root = tmp_path / "app"
    root.mkdir()
    write_registry(root, {"echo": echo(tools=["echo.say", "echo.sleep"])})
    sock = root / ".toolhost" / "host.sock"
    with serve(root, nofile=NOFILE) as proc:
        async with open_client(sock) as bystander:
            with trio.fail_after(30):
                while True:
                    env = await bystander.invoke("echo.say", {"text": "warm"})
                    if env.status == "success":
                        break
                    await trio.sleep(0.1)
            long_call = {}

            async def slow():
                long_call["env"] = await bystander.invoke("echo.sleep", {"seconds": 1.5})

            async with trio.open_nursery() as nursery:
                nursery.start_soon(slow)
                flood: list[socket.socket] = []
                refused = 0
                try:
                    for _ in range(400):
                        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                        flood.append(s)
                        with trio.fail_after(10):
                            while True:  # EAGAIN: the listen backlog is full for a moment
                                try:
                                    s.connect(str(sock))
                                    break
                                except BlockingIOError:
                                    await trio.sleep(0.01)
                    # Every connection over the cap gets one overloaded line, then EOF.
                    for s in flood:
                        s.setblocking(False)
                    with trio.fail_after(30):
                        pending = list(flood)
                        while pending:
                            still = []
                            for s in pending:
                                try:
                                    data = s.recv(65536)
                                except BlockingIOError:
                                    still.append(s)
                                    continue
                                if data:
                                    msg = json.loads(data.splitlines()[0])
                                    assert msg["error"]["code"] == "overloaded", msg
                                    assert "at most 64" in msg["error"]["message"]
                                    refused += 1
                            if len(still) == len(pending) and len(still) <= 64:
                                break  # the rest are the ones the host took (idle, open)
                            pending = still
                            await trio.sleep(0.05)
                    assert refused >= 400 - 64
                    # The bystander is still served while the flood holds its connections.
                    env = await bystander.invoke("echo.say", {"text": "still here"})
                    assert env.status == "success"
                finally:
                    for s in flood:
                        s.close()
            assert long_call["env"].status == "success"
        assert proc.poll() is None, "the host died"
        # Once the flood is gone, new clients are taken again.
        async with open_client(sock) as again:
            env = await again.invoke("echo.say", {"text": "after"})
            assert env.status == "success"
