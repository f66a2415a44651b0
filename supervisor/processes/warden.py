"""The warden: a helper process that kills every registered process group when the host dies.

# Strategy: ``PR_SET_PDEATHSIG`` kills a child when the host dies, but not the child's own
# children, and only on Linux. The warden is the second line of defence: a tiny interpreter
# (``python -S``, nothing of ours imported) reading ``+PGID`` / ``-PGID`` lines from a pipe whose
# other end only the host holds. When the host dies for any reason, SIGKILL included, the pipe
# closes and the warden SIGKILLs every group still registered, grandchildren included. Every
# start (exec or zygote) registers the new process group; reaping it forgets it. There is one
# per process, because the process is what it watches die: :func:`process_warden` hands it
# out, and what ends the process (``toolhost serve``, ``mcp --embedded``, ``doctor``) closes it.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys

from supervisor.processes.linux import disown_child, own_child


class Warden:
    """One helper process per host that kills registered process groups when the host dies."""

    def __init__(self) -> None:
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        if self._proc is not None:
            return
        self._proc = subprocess.Popen(
            [sys.executable, "-S", "-c", _WARDEN_SOURCE],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            close_fds=True,
        )
        own_child(self._proc.pid)  # its Popen reaps it, not the zygote's orphan reaper

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def _send(self, line: bytes) -> None:
        proc = self._proc
        if proc is None or proc.stdin is None:
            return
        try:
            proc.stdin.write(line)
            proc.stdin.flush()
        except (BrokenPipeError, OSError):
            self._proc = None
            disown_child(proc.pid)

    def watch(self, pgid: int) -> None:
        self._send(b"+%d\n" % pgid)

    def forget(self, pgid: int) -> None:
        self._send(b"-%d\n" % pgid)

    def close(self) -> None:
        """Stop the warden; it kills whatever is still registered, which should be nothing."""
        proc = self._proc
        self._proc = None
        if proc is None:
            return
        with contextlib.suppress(OSError):
            if proc.stdin:
                proc.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=2)
        disown_child(proc.pid)


# Runs with -S (no site) so it starts in a few milliseconds and imports nothing of ours.
_WARDEN_SOURCE = r"""
import os, signal, sys
groups = set()
for line in sys.stdin.buffer:
    line = line.strip()
    if not line:
        continue
    try:
        pgid = int(line[1:])
    except ValueError:
        continue
    if line[:1] == b"+":
        groups.add(pgid)
    elif line[:1] == b"-":
        groups.discard(pgid)
for pgid in groups:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except OSError:
        pass
"""


_WARDEN = Warden()


def process_warden() -> Warden:
    """This process's warden (started lazily by the first start of a process)."""
    return _WARDEN
