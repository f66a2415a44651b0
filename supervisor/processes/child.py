"""A running child process of the host, on its pid and a pidfd, however it was started.

# Strategy: every worker process, exec'd by the host or forked by its zygote and adopted by the
# host (a child subreaper), is the host's own child in its own session (process group == pid),
# so one class serves both: the start strategy (:mod:`supervisor.processes.spawn`,
# :mod:`supervisor.processes.zygote`) only decides how the pid came to be and says so in
# :attr:`Child.started_by`. Exit is awaited on a pidfd, so no thread waits on a child (kernels
# without pidfds wait in a thread without reaping); once the leader is a zombie its whole group
# is swept with SIGKILL, then the host reaps it itself with ``waitpid``: it learns every exit
# status, a dead zygote loses none. An exec'd child's ``Popen`` is kept and told the status, so
# the subprocess module never reaps (or, after pid reuse, mistakes) a pid that is ours. Every
# group is registered with the warden at start; :meth:`Child.forget` unregisters it once reaped.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
from collections.abc import Callable
from typing import TYPE_CHECKING, Literal

import trio

from supervisor.processes.linux import disown_child, own_child
from supervisor.processes.warden import Warden

log = logging.getLogger("toolhost.workers")

if TYPE_CHECKING:
    from supervisor.processes.confine_spawn import Prepared

STDERR_RING_BYTES = 64 * 1024


class StderrRing:
    """Keeps the last ``size`` bytes written to a worker's stderr."""

    __slots__ = ("_buf", "size", "tap", "total")

    def __init__(self, size: int = STDERR_RING_BYTES) -> None:
        self.size = size
        self._buf = bytearray()
        self.total = 0
        self.tap: Callable[[bytes], None] | None = None
        """Also gets every chunk: JSON logs forward the lines (supervisor.telemetry.logs) and
        the operator event bus publishes ``log.line`` (chained with ``chain_taps``)."""

    def write(self, data: bytes) -> None:
        if self.tap is not None:
            self.tap(data)
        self.total += len(data)
        buf = self._buf
        buf += data
        if len(buf) > self.size:
            del buf[: len(buf) - self.size]

    def tail(self, limit: int = 4096) -> str:
        """The last ``limit`` bytes as text (cut at a line start when possible)."""
        data = bytes(self._buf[-limit:])
        if len(self._buf) > limit:
            nl = data.find(b"\n")
            if 0 <= nl < len(data) - 1:
                data = data[nl + 1 :]
        return data.decode("utf-8", "replace")


class Child:
    """A child process with non-blocking pipes and an awaitable exit.

    Args:
        pid: The child's pid, which is also its process group (it leads its own session).
        stdin: The host's end of its stdin pipe (None: it has /dev/null).
        stdout: The host's end of its stdout pipe (None: /dev/null).
        stderr: The host's end of its stderr pipe (None: /dev/null).
        started_by: ``exec`` or ``zygote`` (PROTOCOL 6 ``startedBy``).
        warden: The warden its group is registered with.
        popen: An exec'd child's ``Popen``, kept so that the subprocess module never reaps it.
    """

    __slots__ = (
        "_pidfd",
        "_popen",
        "_warden",
        "confinement",
        "pid",
        "returncode",
        "started_by",
        "stderr",
        "stdin",
        "stdout",
    )

    def __init__(
        self,
        pid: int,
        stdin: trio.lowlevel.FdStream | None,
        stdout: trio.lowlevel.FdStream | None,
        stderr: trio.lowlevel.FdStream | None,
        *,
        started_by: Literal["zygote", "exec"],
        warden: Warden,
        popen: subprocess.Popen[bytes] | None = None,
    ) -> None:
        self.pid = pid
        self.started_by: Literal["zygote", "exec"] = started_by
        """How the process started: ``exec`` or ``zygote`` (PROTOCOL 6 ``startedBy``)."""
        self.stdin = stdin
        self.stdout = stdout
        self.stderr = stderr
        self.returncode: int | None = None
        """The exit status once reaped (negative: killed by that signal)."""
        self._warden = warden
        self._popen = popen
        self._pidfd: int | None = None
        self.confinement: Prepared | None = None
        """Its walls (a confined start): the report, the facts, the cleanup at exit."""
        own_child(pid)  # the zygote's orphan reaper leaves it to us: we learn its exit status
        with contextlib.suppress(AttributeError, OSError):
            self._pidfd = os.pidfd_open(pid)

    async def wait(self) -> int:
        """Wait for exit and reap; returns the status (negative: killed by that signal)."""
        if self.returncode is not None:
            return self.returncode
        if self._pidfd is not None:
            await trio.lowlevel.wait_readable(self._pidfd)
        else:  # pragma: no cover - kernels without pidfd: wait (without reaping) in a thread
            await trio.to_thread.run_sync(
                os.waitid, os.P_PID, self.pid, os.WEXITED | os.WNOWAIT, abandon_on_cancel=True
            )
        # The leader is a zombie now: sweep whatever it left in its group, then reap it.
        with contextlib.suppress(OSError):
            os.killpg(self.pid, signal.SIGKILL)
        rc = self._reap(0)
        return rc if rc is not None else self._reaped(-int(signal.SIGKILL))

    def poll(self) -> int | None:
        """The exit status if the child has exited (reaping it), else None."""
        if self.returncode is None:
            self._reap(os.WNOHANG)
        return self.returncode

    def _reap(self, flags: int) -> int | None:
        try:
            pid, status = os.waitpid(self.pid, flags)
        except ChildProcessError:  # not ours any more: treat as killed, and say so
            log.warning(
                "worker %d: its exit status was lost (reaped elsewhere); reported as killed",
                self.pid,
            )
            return self._reaped(-int(signal.SIGKILL))
        if pid == 0:
            return None
        return self._reaped(os.waitstatus_to_exitcode(status))

    def _reaped(self, rc: int) -> int:
        self.returncode = rc
        disown_child(self.pid)
        if self.confinement is not None:
            self.confinement.finish(ended=True)
        if self._popen is not None:
            self._popen.returncode = rc
        if self._pidfd is not None:
            fd, self._pidfd = self._pidfd, None
            os.close(fd)
        return rc

    def signal_group(self, sig: int) -> None:
        """Send ``sig`` to the child's whole process group (a no-op once reaped).

        A zygote-forked worker reports its pid before it starts its own session: for those
        microseconds there is no group yet, and the signal goes to the worker alone.
        """
        if self.returncode is not None:
            return
        try:
            os.killpg(self.pid, sig)
        except ProcessLookupError:
            with contextlib.suppress(OSError):
                os.kill(self.pid, sig)
        except PermissionError:  # pragma: no cover
            with contextlib.suppress(OSError):
                os.kill(self.pid, sig)

    def kill(self) -> None:
        """SIGKILL the child's group; use :meth:`wait` to reap."""
        self.signal_group(signal.SIGKILL)

    async def aclose_streams(self) -> None:
        for stream in (self.stdin, self.stdout, self.stderr):
            if stream is not None:
                with contextlib.suppress(trio.ClosedResourceError, OSError):
                    await stream.aclose()

    def forget(self) -> None:
        """Unregister the group from the warden (once reaped: its members died with it)."""
        self._warden.forget(self.pid)
