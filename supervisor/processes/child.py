"""Child processes that can never outlive the host.

# Strategy: trio's ``open_process`` forks from a worker thread, and ``PR_SET_PDEATHSIG`` fires when
# the *thread* that forked exits, which trio's thread cache does after idling. So children are
# forked here, synchronously on the trio thread (a millisecond, and rare), each in its own session
# (process group == pid) with PDEATHSIG=SIGKILL. A second line of defence, the warden, is one small
# process per host holding a pipe from it: when the host dies for any reason, including SIGKILL,
# the pipe closes and the warden SIGKILLs every process group the host registered, grandchildren
# included. Exit is awaited on a pidfd, so no thread waits on a child either.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import resource
import signal
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Literal

import trio

from supervisor.policy.paths import host_path

PR_SET_PDEATHSIG = 1
STDERR_RING_BYTES = 64 * 1024

ENV_ALLOW = ("PATH", "HOME", "LANG", "TZ", "TMPDIR")  # PROTOCOL 3, exactly (plus LC_*)
ENV_ALLOW_PREFIXES = ("LC_",)


def _load_prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    except OSError:
        return None
    fn = libc.prctl
    fn.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    fn.restype = ctypes.c_int
    return fn


PRCTL = _load_prctl()


def allowed_env(base: Mapping[str, str], extra: Mapping[str, str]) -> dict[str, str]:
    """The environment a sidecar gets: the allow-list from ``base`` (with the host's interpreter
    folder first on PATH, as commands are resolved: policy.paths.host_path), then ``extra``."""
    env = {k: v for k, v in base.items() if k in ENV_ALLOW or k.startswith(ENV_ALLOW_PREFIXES)}
    env["PATH"] = host_path(base.get("PATH"), sys.executable)
    env.update(extra)
    return env


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


def warden() -> Warden:
    """The process-wide warden (started lazily by the first spawn)."""
    return _WARDEN


class ChildProcess:
    """A spawned child with non-blocking pipes and an awaitable exit."""

    def __init__(
        self,
        popen: subprocess.Popen[bytes],
        stdin: trio.lowlevel.FdStream | None,
        stdout: trio.lowlevel.FdStream | None,
        stderr: trio.lowlevel.FdStream | None,
    ) -> None:
        self._popen = popen
        self.pid = popen.pid
        self.started_by: Literal["zygote", "exec"] = "exec"
        """How the process started: ``exec`` or ``zygote`` (PROTOCOL 6 ``startedBy``)."""
        self.stdin = stdin
        self.stdout = stdout
        self.stderr = stderr
        self.returncode: int | None = None
        self._pidfd: int | None = None
        with contextlib.suppress(AttributeError, OSError):
            self._pidfd = os.pidfd_open(popen.pid)

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
        rc = self._popen.wait()
        self.returncode = rc
        self._close_pidfd()
        return rc

    def poll(self) -> int | None:
        if self.returncode is None:
            rc = self._popen.poll()
            if rc is not None:
                self.returncode = rc
                self._close_pidfd()
        return self.returncode

    def _close_pidfd(self) -> None:
        if self._pidfd is not None:
            fd, self._pidfd = self._pidfd, None
            os.close(fd)

    def signal_group(self, sig: int) -> None:
        """Send ``sig`` to the child's whole process group (a no-op once reaped)."""
        if self.returncode is not None:
            return
        try:
            os.killpg(self.pid, sig)
        except ProcessLookupError:
            pass
        except PermissionError:  # pragma: no cover
            with contextlib.suppress(OSError):
                os.kill(self.pid, sig)

    def kill(self) -> None:
        """SIGKILL the child's group; use :meth:`wait` to reap."""
        self.signal_group(signal.SIGKILL)
        # Grandchildren in the group die with it; the warden no longer needs to know the group.

    async def aclose_streams(self) -> None:
        for stream in (self.stdin, self.stdout, self.stderr):
            if stream is not None:
                with contextlib.suppress(trio.ClosedResourceError, OSError):
                    await stream.aclose()

    def forget(self) -> None:
        warden().forget(self.pid)


def make_preexec(limits: Sequence[tuple[int, int, int]]) -> Callable[[], None]:
    prctl = PRCTL
    setrlimit = resource.setrlimit
    host_pid = os.getpid()
    getppid = os.getppid
    kill = os.kill
    sigkill = signal.SIGKILL

    def preexec() -> None:  # runs in the child between fork and exec
        if prctl is not None:
            prctl(PR_SET_PDEATHSIG, sigkill, 0, 0, 0)
            if getppid() != host_pid:  # the host died before prctl took effect
                kill(os.getpid(), sigkill)
        for which, soft, hard in limits:
            try:
                setrlimit(which, (soft, hard))
            except (ValueError, OSError):
                pass

    return preexec


def exec_child(
    argv: Sequence[str],
    *,
    cwd: str,
    env: Mapping[str, str],
    limits: Sequence[tuple[int, int, int]] = (),
    stdin: bool = True,
    stdout: bool = True,
    stderr: bool = True,
) -> ChildProcess:
    """Fork and exec ``argv`` in its own session with pipes; never outlives the host (the exec
    way to start a worker; :func:`supervisor.processes.spawn.spawn` chooses between it and the
    zygote).

    Args:
        argv: Program and arguments (``argv[0]`` already resolved).
        cwd: Working directory.
        env: The complete environment.
        limits: ``(resource, soft, hard)`` rlimits applied before exec.
        stdin: Give the child a stdin pipe (else /dev/null).
        stdout: Give the child a stdout pipe (else /dev/null).
        stderr: Give the child a stderr pipe (else /dev/null).

    Raises:
        OSError: The program could not be executed (the message names it).
    """
    w = warden()
    w.start()
    fds: list[int] = []

    def pipe() -> tuple[int, int]:
        r, wr = os.pipe()
        fds.extend((r, wr))
        return r, wr

    in_r = in_w = out_r = out_w = err_r = err_w = -1
    try:
        if stdin:
            in_r, in_w = pipe()
        if stdout:
            out_r, out_w = pipe()
        if stderr:
            err_r, err_w = pipe()
        popen = subprocess.Popen(
            list(argv),
            cwd=cwd,
            env=dict(env),
            stdin=in_r if stdin else subprocess.DEVNULL,
            stdout=out_w if stdout else subprocess.DEVNULL,
            stderr=err_w if stderr else subprocess.DEVNULL,
            start_new_session=True,
            close_fds=True,
            preexec_fn=make_preexec(limits),
        )
    except BaseException:
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        raise
    for fd in (in_r, out_w, err_w):
        if fd >= 0:
            os.close(fd)
    w.watch(popen.pid)
    return ChildProcess(
        popen,
        trio.lowlevel.FdStream(in_w) if stdin else None,
        trio.lowlevel.FdStream(out_r) if stdout else None,
        trio.lowlevel.FdStream(err_r) if stderr else None,
    )
