"""A kernel frame nested past the parser's recursion limit gets a structured error and the host
stays up (before this, one such frame from any client ended ``toolhost serve``)."""

import json
import socket

from tests.conftest import write_registry
from tests.e2e.conftest import serve

DEEP = b"[" * 200_000 + b"]" * 200_000


def ask(sock, frame: bytes) -> dict:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(30)
        s.connect(str(sock))
        s.sendall(frame)
        data = b""
        while not data.endswith(b"\n"):
            chunk = s.recv(65536)
            assert chunk, "the host closed the connection without an answer"
            data += chunk
        return json.loads(data.splitlines()[0])


def test_a_deeply_nested_frame_is_refused_and_the_host_lives(tmp_path):
    root = tmp_path / "app"
    write_registry(root, {})
    with serve(root) as proc:
        sock = root / ".toolhost" / "host.sock"
        frame = b'{"id":1,"method":"tools.invoke","params":{"tool":"x","input":' + DEEP + b"}}\n"
        answer = ask(sock, frame)
        assert answer["error"]["code"] == "invalid-request"
        assert "nested too deeply" in answer["error"]["message"]
        hello = ask(sock, b'{"id":2,"method":"server.hello","params":{}}\n')
        assert hello["result"]["protocol"] == "toolhost/1"
        assert proc.poll() is None
