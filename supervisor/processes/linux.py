"""The kernel's process knobs toolhost turns: prctl (death signal, child subreaper), rlimits, umask.

# Strategy: one module, standard library only, imported by both sides of a fork: by the host
# (the exec start's ``preexec``, the zygote's supervision) and by the zygote's own interpreter
# (``zygote_main``, which must not import trio or anything the preload list did not ask for),
# and by the walls (``walls``, ``seccomp``), also in the exec shim's bare ``python -I -S``.
# ``prctl`` comes from libc through ctypes (:mod:`cabi`'s few pieces of it), loaded once at
# import (:func:`load_prctl`, the one place that binds it: the process's own symbols, no
# library search, which would start ``ldconfig``); where it is missing (not Linux, no libc)
# :data:`PRCTL` is None and what needs it says so or does without. Everything that runs
# between fork and exec (:func:`make_preexec`, :func:`die_with_parent`,
# :func:`set_rlimits`) allocates little and raises nothing. The host becomes a child subreaper
# only while it runs a zygote; the orphans that adopts are reaped by :func:`reap_orphans`.
"""

from __future__ import annotations

import os
import resource
import sys

if __package__:  # inside the package
    from supervisor.processes import cabi
else:  # pragma: no cover - loaded by the exec shim from this folder (never the package's copy)
    import cabi  # type: ignore[no-redef]

TYPE_CHECKING = False  # not typing's: the exec shim imports this module, and typing costs it ~28 ms
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Sequence

    Prctl = Callable[[int, int, int, int, int], int]

PR_SET_PDEATHSIG = 1
SIGKILL = 9
"""``signal.SIGKILL`` on Linux (the ``signal`` module and its ``enum`` cost the shim ~4 ms)."""
PR_SET_CHILD_SUBREAPER = 36


def load_prctl() -> Prctl | None:
    """libc's ``prctl``, with ``errno`` kept for ``ctypes.get_errno`` (None: not Linux, or no
    libc to load). Looked up in the process's own symbols (the interpreter links libc), then in
    ``libc.so.6``; never through ``ctypes.util.find_library``, which runs ``ldconfig``."""
    if not sys.platform.startswith("linux"):
        return None
    fn = None
    for name in (None, "libc.so.6"):
        try:
            fn = cabi.CDLL(name).prctl
            break
        except (OSError, AttributeError):
            continue
    if fn is None:
        return None
    fn.argtypes = [cabi.c_int, cabi.c_ulong, cabi.c_ulong, cabi.c_ulong, cabi.c_ulong]
    fn.restype = cabi.c_int
    fn_typed: Prctl = fn
    return fn_typed


PRCTL = load_prctl()
"""This process's ``prctl`` (None where there is none)."""


def die_with_parent(parent: int) -> bool:
    """Have the kernel SIGKILL this process when its parent thread exits (``PR_SET_PDEATHSIG``).

    Safe between fork and exec. Without ``prctl`` this does nothing and returns True.

    Args:
        parent: The pid the parent must still be once the death signal is set.

    Returns:
        False when the parent is no longer ``parent``: it died before the request took effect
        and the caller must leave at once.
    """
    prctl = PRCTL
    if prctl is None:
        return True
    prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0)
    return os.getppid() == parent


def set_rlimits(limits: Iterable[Sequence[int]]) -> None:
    """Apply ``(resource, soft, hard)`` limits, skipping those the kernel refuses (fork-safe)."""
    setrlimit = resource.setrlimit
    for which, soft, hard in limits:
        try:
            setrlimit(which, (soft, hard))
        except (ValueError, OSError):
            pass


def make_preexec(limits: Sequence[tuple[int, int, int]]) -> Callable[[], None]:
    """What a child runs between fork and exec: die with this process, then take ``limits``."""
    host_pid = os.getpid()
    getpid = os.getpid
    kill = os.kill
    sigkill = SIGKILL

    def preexec() -> None:  # runs in the child between fork and exec
        if not die_with_parent(host_pid):  # the host died before the death signal took effect
            kill(getpid(), sigkill)
        set_rlimits(limits)

    return preexec


def set_subreaper(on: bool) -> str | None:
    """Make this process adopt its descendants' orphans (``PR_SET_CHILD_SUBREAPER``), or stop.

    Returns:
        None when done; else why not.
    """
    prctl = PRCTL
    if prctl is None:
        return "prctl is not available"
    if prctl(PR_SET_CHILD_SUBREAPER, 1 if on else 0, 0, 0, 0) != 0:
        return f"PR_SET_CHILD_SUBREAPER failed: {os.strerror(cabi.get_errno())}"
    return None


_OWN: set[int] = set()
"""Children of this process that their owner reaps (:func:`own_child`)."""


def own_child(pid: int) -> None:
    """``pid``, a child of this process that leads a session of its own, is reaped by its owner
    (a worker's ``Child``, the zygote's or the warden's ``Popen``): :func:`reap_orphans` leaves
    it alone until :func:`disown_child`."""
    _OWN.add(pid)


def disown_child(pid: int) -> None:
    """``pid`` was reaped by its owner, or its owner gave up on it (then, once it is a zombie,
    :func:`reap_orphans` may reap it)."""
    _OWN.discard(pid)


def reap_orphans() -> int:
    """Reap exited processes this process adopted as a subreaper; returns how many.

    Never a child that something here waits for: one in this process's session (a ``Popen``,
    trio's processes) or one its owner registered (:func:`own_child`: every worker's ``Child``,
    the zygote, the warden). Those lead sessions of their own, so their session cannot tell them
    from an adopted orphan that started one (a ``task.background`` keeper whose worker ended),
    which is reaped. A worker reaped here before its ``Child`` lost its exit status (``ECHILD``,
    reported as SIGKILL): the zygote's spare woke the zygote's task, which runs this, right
    after every confined start, just when a per-call worker exits.
    """
    me = os.getpid()
    my_sid = os.getsid(0)
    reaped = 0
    try:
        tasks = os.listdir(f"/proc/{me}/task")
    except OSError:
        return 0
    for tid in tasks:
        try:
            with open(f"/proc/{me}/task/{tid}/children") as f:
                kids = [int(p) for p in f.read().split()]
        except (OSError, ValueError):
            continue
        for pid in kids:
            try:
                with open(f"/proc/{pid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            state, sid = fields[0], int(fields[3])  # state ppid pgrp session ...
            if state != "Z" or sid == my_sid or pid in _OWN:
                continue
            try:
                os.waitpid(pid, os.WNOHANG)
                reaped += 1
            except OSError:  # ChildProcessError is one
                pass
    return reaped


def current_umask() -> int:
    """This process's umask, read without changing it (threads may be creating files)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o22)  # pragma: no cover - kernels before 4.7
    os.umask(mask)
    return mask
