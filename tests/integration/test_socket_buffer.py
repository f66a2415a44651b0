"""``grow_socket``: the kernel socket's send buffer grown for a large answer (a 1 MiB resource
leaves the host in one or two writes, not one per default-sized buffer). Real sockets."""

from __future__ import annotations

import socket
from pathlib import Path

import trio

from supervisor.processes.direct_write import SOCKET_BUFFER, grow_socket


def _wmem_max() -> int:
    try:
        return int(Path("/proc/sys/net/core/wmem_max").read_text())
    except (OSError, ValueError):
        return 0


async def test_grow_socket_grows_the_send_buffer_as_far_as_the_system_allows() -> None:
    a, b = trio.socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with a, b:
        before = a.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)
        grew = grow_socket(a)
        after = a.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)
        assert after >= before  # never shrinks
        assert grew == (after > before)
        # Linux doubles the request and caps it at twice net.core.wmem_max (root too, since
        # SO_SNDBUF, not SO_SNDBUFFORCE, is asked): it grows whenever the cap is above it.
        if 2 * min(SOCKET_BUFFER, _wmem_max()) > before:
            assert grew and after >= min(SOCKET_BUFFER, _wmem_max())
        # Asked again once it is that large: nothing to do.
        if after >= SOCKET_BUFFER:
            assert grow_socket(a) is False
