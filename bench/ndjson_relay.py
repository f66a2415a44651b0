"""The plain NDJSON relay: the simplest possible host, as a baseline for toolhost's own CPU.

``python -m bench.ndjson_relay SOCKET WORKERS CONCURRENCY`` starts WORKERS echo workers (each
told ``ECHO_CONCURRENCY=CONCURRENCY``), sends each the ``init`` line and waits for ``ready``,
listens on SOCKET, prints ``listening``, and serves one client: every ``tools.invoke`` request
line is decoded (msgspec), queued FIFO, written as a ``call`` line to the least-loaded worker with
a free slot, and each ``result`` line is decoded and answered to the client as a response with a
small envelope. That is the least a host that understands both protocols must do: no gate, no
deadlines, no accounting, no audit, no supervision. toolhost's CPU per call and calls/s are
reported against it (``bench/throughput.py``).

# Strategy: one thread, ``selectors``, non-blocking descriptors, a write buffer per descriptor.
"""

from __future__ import annotations

import os
import selectors
import socket
import sys
from collections import deque
from typing import Any

import msgspec

from bench.floors import PipeWorker

CHUNK = 1 << 16


class Request(msgspec.Struct):
    id: int
    method: str
    params: msgspec.Raw


class InvokeParams(msgspec.Struct):
    tool: str
    input: msgspec.Raw


class Call(msgspec.Struct):
    id: int
    tool: str
    input: msgspec.Raw
    deadlineMs: int
    type: str = "call"


class Result(msgspec.Struct):
    type: str
    id: Any = None
    ok: bool = False
    data: msgspec.Raw = msgspec.Raw(b"null")
    content: str | None = None
    error: str | None = None
    code: str | None = None
    concurrency: int = 1


class Envelope(msgspec.Struct, omit_defaults=True):
    status: str
    tool: str
    content: str
    data: msgspec.Raw = msgspec.Raw(b"null")


class Response(msgspec.Struct):
    id: int
    result: Envelope


class Worker:
    """One echo worker after its init/ready handshake (``bench.floors.PipeWorker``)."""

    def __init__(self, concurrency: int) -> None:
        pipe = PipeWorker(concurrency)
        self.proc = pipe.proc
        self.wfd = pipe.wfd
        self.rfd = pipe.rfile.fileno()  # nothing is buffered past the ready line
        self.concurrency = concurrency
        self.inflight: dict[int, tuple[int, str]] = {}
        self.inbuf = b""
        self.out = bytearray()


def serve(path: str, workers: list[Worker]) -> None:
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(1)
    print("listening", flush=True)
    client, _ = listener.accept()
    cfd = client.fileno()
    sel = selectors.DefaultSelector()
    for fd in [cfd] + [w.rfd for w in workers]:
        os.set_blocking(fd, False)
    for w in workers:
        os.set_blocking(w.wfd, False)
    by_rfd = {w.rfd: w for w in workers}
    sel.register(cfd, selectors.EVENT_READ)
    for w in workers:
        sel.register(w.rfd, selectors.EVENT_READ)
    decode_req = msgspec.json.Decoder(Request).decode
    decode_params = msgspec.json.Decoder(InvokeParams).decode
    decode_result = msgspec.json.Decoder(Result).decode
    encode = msgspec.json.Encoder().encode
    queue: deque[tuple[int, str, msgspec.Raw]] = deque()
    cbuf = b""
    cout = bytearray()
    next_id = 0

    def dispatch() -> None:
        nonlocal next_id
        while queue:
            best = None
            for w in workers:
                if len(w.inflight) < w.concurrency and (
                    best is None or len(w.inflight) < len(best.inflight)
                ):
                    best = w
            if best is None:
                return
            rid, tool, inp = queue.popleft()
            next_id += 1
            best.inflight[next_id] = (rid, tool)
            best.out += encode(Call(next_id, tool, inp, 30000)) + b"\n"

    def flush(fd: int, buf: bytearray) -> None:
        while buf:
            try:
                n = os.write(fd, buf)
            except BlockingIOError:
                return  # the next round tries again (the peers read promptly)
            del buf[:n]

    while True:
        for key, _ in sel.select(timeout=0.05 if (cout or any(w.out for w in workers)) else None):
            fd = key.fd
            if fd == cfd:
                data = os.read(cfd, CHUNK)
                if not data:
                    return
                cbuf += data
                *lines, cbuf = cbuf.split(b"\n")
                for line in lines:
                    req = decode_req(line)
                    p = decode_params(req.params)
                    queue.append((req.id, p.tool, p.input))
                dispatch()
            else:
                w = by_rfd[fd]
                data = os.read(fd, CHUNK)
                if not data:
                    return
                w.inbuf += data
                *lines, w.inbuf = w.inbuf.split(b"\n")
                for line in lines:
                    r = decode_result(line)
                    if r.type != "result":
                        continue
                    rid, tool = w.inflight.pop(r.id)
                    env = Envelope(
                        status="success" if r.ok else "failed",
                        tool=tool,
                        content=r.content or (r.error or "ok"),
                        data=r.data,
                    )
                    cout += encode(Response(rid, env)) + b"\n"
                dispatch()
        for w in workers:
            flush(w.wfd, w.out)
        flush(cfd, cout)


def main(argv: list[str]) -> None:
    path, count, concurrency = argv[0], int(argv[1]), int(argv[2])
    workers = [Worker(concurrency) for _ in range(count)]
    try:
        serve(path, workers)
    finally:
        for w in workers:
            w.proc.kill()
            w.proc.wait()


if __name__ == "__main__":
    main(sys.argv[1:])
