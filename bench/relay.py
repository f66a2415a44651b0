"""The plain relay of the two-hop floor: Unix socket <-> pipes of one echo worker, no trio.

``python -m bench.relay SOCKET COMMAND [ARG...]`` starts COMMAND with pipes, listens on SOCKET,
prints ``listening`` on stdout, accepts one client and forwards bytes both ways (client ->
worker stdin, worker stdout -> client) until either side closes. It parses nothing: it is the
least work any relay between a socket and a worker's pipes can do, so the host's end-to-end
latency divided by this floor's is the cost of everything toolhost adds on top of a second hop.

# Strategy: one thread, ``selectors``, non-blocking descriptors and a byte buffer per direction,
# so a large payload in one direction can never deadlock against the other.
"""

from __future__ import annotations

import os
import selectors
import socket
import subprocess
import sys

CHUNK = 1 << 16


def relay(client: socket.socket, to_worker: int, from_worker: int) -> None:
    """Forward bytes between ``client`` and the worker's pipe ends until one side closes."""
    sel = selectors.DefaultSelector()
    cfd = client.fileno()
    for fd in (cfd, to_worker, from_worker):
        os.set_blocking(fd, False)
    pending = {cfd: bytearray(), to_worker: bytearray()}  # bytes waiting to be written to fd
    sel.register(cfd, selectors.EVENT_READ)
    sel.register(from_worker, selectors.EVENT_READ)
    watching_write: set[int] = set()

    def want_write(fd: int) -> None:
        if fd in watching_write:
            return
        watching_write.add(fd)
        if fd == cfd:
            sel.modify(cfd, selectors.EVENT_READ | selectors.EVENT_WRITE)
        else:
            sel.register(fd, selectors.EVENT_WRITE)

    def flush(fd: int) -> None:
        buf = pending[fd]
        while buf:
            try:
                n = os.write(fd, buf)
            except BlockingIOError:
                want_write(fd)
                return
            del buf[:n]
        if fd in watching_write:
            watching_write.discard(fd)
            if fd == cfd:
                sel.modify(cfd, selectors.EVENT_READ)
            else:
                sel.unregister(fd)

    while True:
        for key, mask in sel.select():
            fd = key.fd
            if mask & selectors.EVENT_READ:
                src_to = to_worker if fd == cfd else cfd
                try:
                    data = os.read(fd, CHUNK)
                except BlockingIOError:
                    data = None
                if data == b"":
                    return
                if data:
                    pending[src_to] += data
                    flush(src_to)
            if mask & selectors.EVENT_WRITE:
                flush(fd)


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print("usage: python -m bench.relay SOCKET COMMAND [ARG...]", file=sys.stderr)
        return 64
    path, command = argv[0], argv[1:]
    worker = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert worker.stdin is not None and worker.stdout is not None
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(1)
    print("listening", flush=True)
    client, _ = server.accept()
    server.close()
    try:
        relay(client, worker.stdin.fileno(), worker.stdout.fileno())
    finally:
        client.close()
        worker.stdin.close()
        worker.wait(timeout=10)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
