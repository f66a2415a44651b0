"""The plain relay of the two-hop floor: Unix socket <-> pipes of one echo worker, no trio.

``python -m bench.relay SOCKET COMMAND [ARG...]`` starts COMMAND with pipes, listens on SOCKET,
prints ``listening`` on stdout, accepts one client and forwards bytes both ways (client ->
worker stdin, worker stdout -> client) until either side closes. With ``-`` for SOCKET the client
is this process's own stdin and stdout (a stdio MCP server's plain one-hop floor). It parses
nothing: it is the least work any relay between a socket and a worker's pipes can do, so the
host's end-to-end latency divided by this floor's is the cost of everything toolhost adds on top
of a second hop.

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


def relay(client: socket.socket | tuple[int, int], to_worker: int, from_worker: int) -> None:
    """Forward bytes between ``client`` (a socket, or the descriptors ``(read, write)`` of
    pipes) and the worker's pipe ends until one side closes."""
    sel = selectors.DefaultSelector()
    cin, cout = _ends(client)
    for fd in {cin, cout, to_worker, from_worker}:
        os.set_blocking(fd, False)
    pending = {cout: bytearray(), to_worker: bytearray()}  # bytes waiting to be written to fd
    events: dict[int, int] = {cin: selectors.EVENT_READ, from_worker: selectors.EVENT_READ}
    for fd, ev in events.items():
        sel.register(fd, ev)

    def watch(fd: int, ev: int, on: bool) -> None:
        was = events.get(fd, 0)
        now = was | ev if on else was & ~ev
        if now == was:
            return
        if not was:
            sel.register(fd, now)
        elif not now:
            sel.unregister(fd)
        else:
            sel.modify(fd, now)
        if now:
            events[fd] = now
        else:
            events.pop(fd, None)

    def flush(fd: int) -> None:
        buf = pending[fd]
        while buf:
            try:
                n = os.write(fd, buf)
            except BlockingIOError:
                watch(fd, selectors.EVENT_WRITE, True)
                return
            del buf[:n]
        watch(fd, selectors.EVENT_WRITE, False)

    while True:
        for key, mask in sel.select():
            fd = key.fd
            if mask & selectors.EVENT_READ and fd in (cin, from_worker):
                src_to = to_worker if fd == cin else cout
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


def _ends(client: socket.socket | tuple[int, int]) -> tuple[int, int]:
    if isinstance(client, socket.socket):
        return client.fileno(), client.fileno()
    return client


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print("usage: python -m bench.relay SOCKET|- COMMAND [ARG...]", file=sys.stderr)
        return 64
    path, command = argv[0], argv[1:]
    worker = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert worker.stdin is not None and worker.stdout is not None
    if path == "-":  # this process's own stdin and stdout, e.g. in front of an MCP server
        try:
            relay((0, 1), worker.stdin.fileno(), worker.stdout.fileno())
        finally:
            worker.stdin.close()
            worker.wait(timeout=10)
        return 0
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
