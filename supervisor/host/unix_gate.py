"""The Unix socket gate, the host's side: it answers every ``connect`` of a gated worker.

# Strategy (``processes/unix_gate.py`` says why the gate exists and how one answer is made): a
# worker whose profile grants ``unix`` paths sends, with its walls' report, the notification
# descriptor of its syscall filter. :meth:`UnixGate.watch` takes the worker's report channel
# at its start; a task of the gate's own nursery reads the report (and the descriptor), hands
# the report to the worker's ``Prepared`` and then serves the descriptor until every process
# behind it (the worker, its children, what ``confine.keep`` kept) has exited. Each answer is
# made in a thread (a ``connect`` may block); a refusal is logged once per path and sidecar,
# with the grant that would allow it. Without the gate (the host stops), a gated ``connect``
# fails with ``ENOSYS``: it never passes unchecked.
"""

from __future__ import annotations

import array
import contextlib
import logging
import os
import socket
from collections.abc import Callable

import trio

from supervisor.processes import unix_gate
from supervisor.processes.confine_spawn import Prepared
from supervisor.processes.walls import read_report

log = logging.getLogger("toolhost.confine")


class UnixGate:
    """Serves the gated workers' ``connect`` s (one task per worker, in its own nursery)."""

    def __init__(self) -> None:
        self._nursery: trio.Nursery | None = None
        self.answered = 0
        """Connects answered (allowed or refused), for tests and stats."""
        self.refused = 0
        self.serving = 0
        """Workers (with what they started) the gate serves now: one task each."""

    async def run(
        self, *, task_status: trio.TaskStatus[UnixGate] = trio.TASK_STATUS_IGNORED
    ) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started(self)
            await trio.sleep_forever()

    def watch(
        self, channel: socket.socket, prepared: Prepared, rules: unix_gate.Rules
    ) -> Callable[[], None] | None:
        """Serve the worker whose report comes on ``channel`` (the gate owns it from now on);
        returns what stops waiting for a report that will not come (the worker ended first).
        None: the gate does not run (the caller keeps the channel)."""
        if self._nursery is None:
            return None
        waiting = trio.CancelScope()
        self._nursery.start_soon(self._serve, channel, prepared, rules, waiting)
        return waiting.cancel

    async def _serve(
        self,
        channel: socket.socket,
        prepared: Prepared,
        rules: unix_gate.Rules,
        waiting: trio.CancelScope,
    ) -> None:
        self.serving += 1
        try:
            listener = await _take_report(channel, prepared, waiting)
            if listener >= 0:
                try:
                    await self._answer_all(listener, prepared.plan.sidecar, rules)
                finally:
                    os.close(listener)
        finally:
            self.serving -= 1

    async def _answer_all(self, listener: int, sidecar: str, rules: unix_gate.Rules) -> None:
        """Answer every connect behind ``listener`` until its processes are all gone."""
        while True:
            await trio.lowlevel.wait_readable(listener)
            req = unix_gate.receive(listener)
            if req is None:
                if unix_gate.done(listener):
                    return
                continue
            err, why = await trio.to_thread.run_sync(
                unix_gate.decide, listener, req, rules, abandon_on_cancel=True
            )
            unix_gate.answer(listener, req, err)
            self.answered += 1
            if why:
                self.refused += 1
                hint = (
                    " (a path confine.unix grants, or a folder above it, is allowed)"
                    if why.endswith("(confine.unix)")
                    else ""
                )
                log.warning(
                    "sidecar %s: connect refused by the Unix socket gate: %s%s", sidecar, why, hint
                )


async def _take_report(
    channel: socket.socket, prepared: Prepared, waiting: trio.CancelScope
) -> int:
    """Read the worker's report (handed to ``prepared``) and the gate's descriptor that comes
    with it (-1: none came, or the wait was given up: the worker ended first)."""
    listener = -1
    with channel:
        with waiting:
            await trio.lowlevel.wait_readable(channel)
        if waiting.cancelled_caught:
            return -1
        try:
            data, ancillary, _flags, _addr = channel.recvmsg(65536, socket.CMSG_SPACE(4))
        except OSError:
            return -1
        for level, kind, payload in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds = array.array("i")
                fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
                for fd in fds:
                    if listener < 0:
                        listener = fd
                    else:
                        os.close(fd)
        with contextlib.suppress(ValueError):
            prepared.reported(read_report(data))
    return listener
