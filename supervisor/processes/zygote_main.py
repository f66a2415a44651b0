"""The zygote process: a preloaded Python interpreter that forks sidecar workers on request.

# Strategy (docs/zygote.md): the host starts this module with its own interpreter, no flags and
# the allow-listed environment, so the interpreter state it preloads is what a fresh worker would
# build. It imports the preload list, runs ``gc.collect(); gc.freeze()`` (so the reference counts
# a worker touches do not unshare the heap pages), then serves requests that arrive on the
# inherited SOCK_SEQPACKET socket (fd 3): one JSON message plus the worker's stdin, stdout and
# stderr ends by SCM_RIGHTS. Each request is a double fork: the intermediate child forks the
# worker and exits at once, so the worker is adopted by the host (a child subreaper) and the
# host, not this process, reaps it; killing the zygote leaves its workers alone. The worker waits
# to be adopted, sets PDEATHSIG against the host, reports its own pid to the host on the socket
# (so no worker exists that the host was not told of), starts its own session, takes its three
# fds as 0/1/2, closes every other fd, and makes argv, environment, cwd, umask, rlimits, signal
# dispositions and mask, ``sys.path`` and ``random`` what an exec'd ``python -m mod`` or
# ``python script`` would have; then :func:`main` *returns* the request and the bootstrap runs
# the module or script as ``__main__`` with no zygote frame left on the stack.
#
# A confined start (PROTOCOL 7) also brings the worker's walls: the ``memfd`` holding them
# (``Walls.dumps``) and the descriptors they name (the report channel, the Landlock ruleset, the
# namespaces), after the three stdio ends; the request maps the host's numbers of those
# descriptors to their place in the message. The worker keeps them through the fd sweep, puts
# the walls up (:mod:`supervisor.processes.walls`, the code the exec shim runs) once it is
# otherwise what an exec'd worker would be, and before its first instruction; then it runs the
# Python worker, or (``exec``: any other program) ``execve`` s it. A wall that fails under
# ``required``, or a program that cannot be executed, ends the worker with status 126 and one
# line on stderr, as the shim does.
#
# A confined worker's pids group (cgroup v1) is joined by a migration, which waits for an RCU
# grace period (~15 ms); the spare takes it off the critical path. On the host's ``{"spare":
# n, "procs": ...}`` the zygote forks a spare: a child that writes its pid into that (empty,
# ``pids.max`` 1) group at once, then waits on its own socketpair. A fork request naming spare
# ``n`` is forwarded to it (the message and the descriptors) instead of forking an intermediate:
# the spare, already in the group, forks the worker there (a fork keeps the group: no
# migration) and exits, as the intermediate does; the worker then skips the join (``joined``).
# A spare that could not join or fork says so by its exit status and the zygote forks the
# intermediate as before (the worker joins the group itself). The spare is a fork of the zygote
# made before the request, so it holds nothing of any sidecar; at most one exists.
#
# This module imports only the standard library and :mod:`supervisor.processes.linux`,
# :mod:`~supervisor.processes.walls` and :mod:`~supervisor.processes.netns` (standard library
# only, shared with the host's side and the exec shim): it is the zygote's first import and must
# not preload anything the preload list did not ask for (no trio).
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import json
import os
import random
import resource
import signal
import socket
import sys
import time
from typing import Any, NoReturn

from supervisor.processes import linux, netns, pymain, walls

_FOR_CONFINED_STARTS = (netns,)
"""Imported by the zygote, so that a confined worker does not import it after the fork."""

ZYGOTE_FD = 3
"""The zygote's end of its socketpair with the host."""
MAX_MESSAGE = 1 << 20
MAX_FDS = 16
"""Descriptors one request may carry: stdio, the walls' memfd and what the walls name."""
CONFINEMENT_FAILED = 126
"""The worker's exit status when its walls could not go up (``required``) or its program could
not be executed (the exec shim's)."""
ADOPT_DEADLINE_S = 2.0
SPARE_UNJOINED = 3
"""A spare's exit status: it could not join its group (no request read from it)."""
SPARE_NO_FORK = 4
"""A spare's exit status: it could not read the request or fork the worker."""

_SPARE: list[Any] = []
"""The zygote's spare, when it has one: ``[n, pid, its socket]``."""

# What a fresh interpreter has, recorded before the zygote touches anything.
_FRESH_SIGNALS: dict[int, Any] = {}
_FRESH_PATH: list[str] = []
_FRESH_MODULES: dict[str, Any] = {}


def _record_fresh_state(fresh_path: list[str]) -> None:
    _FRESH_MODULES.update(sys.modules)
    for sig in signal.valid_signals():
        if sig in (signal.SIGKILL, signal.SIGSTOP):
            continue
        try:
            _FRESH_SIGNALS[sig] = signal.getsignal(sig)
        except (OSError, ValueError):
            continue
    _FRESH_PATH[:] = fresh_path


def thread_count() -> int:
    """Threads of this process as the kernel counts them (C threads included)."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        import threading

        return threading.active_count()


def _preload(modules: list[str]) -> tuple[list[str], list[dict[str, str]]]:
    loaded: list[str] = []
    failed: list[dict[str, str]] = []
    for name in modules:
        try:
            importlib.import_module(name)
            loaded.append(name)
        except BaseException as exc:  # a bad preload must not kill the zygote
            failed.append({"module": name, "error": f"{type(exc).__name__}: {exc}"})
    return loaded, failed


def _module_files() -> list[str]:
    files = []
    for mod in list(sys.modules.values()):
        path = getattr(mod, "__file__", None)
        if isinstance(path, str) and os.path.isabs(path):
            files.append(path)
    return sorted(set(files))


def _send(sock: socket.socket, obj: dict[str, Any]) -> None:
    sock.send(json.dumps(obj, separators=(",", ":")).encode())


def _preloaded_tops() -> dict[str, str]:
    """Top-level modules the preload imported, each with the folder it was found in (a worker
    whose ``sys.path[0]`` holds another module of that name must be exec'd)."""
    tops: dict[str, str] = {}
    for name, mod in list(sys.modules.items()):
        if "." in name or name in _FRESH_MODULES:
            continue
        path = getattr(mod, "__file__", None)
        if not isinstance(path, str) or not os.path.isabs(path):
            continue
        folder = os.path.dirname(path)
        if os.path.basename(path) == "__init__.py":
            folder = os.path.dirname(folder)
        tops[name] = folder
    return tops


def main(preload: list[str], fresh_path: list[str]) -> dict[str, Any] | None:
    """Preload, then serve fork requests until the host goes away.

    Args:
        preload: Modules to import before forking.
        fresh_path: ``sys.path`` of a fresh interpreter without its first entry.

    Returns:
        In the zygote: None once the host closed the socket (the zygote then exits). In a forked
        worker: the request, for :func:`run_worker`.
    """
    _record_fresh_state(fresh_path)
    sock = socket.socket(fileno=ZYGOTE_FD)
    host_pid = os.getppid()
    if not linux.die_with_parent(host_pid):
        os._exit(1)
    loaded, failed = _preload(preload)
    gc.collect()
    gc.freeze()
    _send(
        sock,
        {
            "hello": True,
            "pid": os.getpid(),
            "preloaded": loaded,
            "failed": failed,
            "files": _module_files(),
            "tops": _preloaded_tops(),
            "threads": thread_count(),
        },
    )
    while True:
        try:
            msg, fds, _flags, _addr = socket.recv_fds(sock, MAX_MESSAGE, MAX_FDS)
        except InterruptedError:
            continue
        except OSError:
            return None
        if not msg:
            return None
        try:
            req = json.loads(msg)
            if "procs" in req:  # make a spare; no descriptors come with it
                for fd in fds:
                    os.close(fd)
                if thread_count() == 1 and _new_spare(sock, req, host_pid):
                    return req["worker"]
                continue
            rid = req["id"]
        except (ValueError, KeyError, TypeError):
            for fd in fds:
                os.close(fd)
            continue
        threads = thread_count()
        expected = _fd_count(req)
        if threads != 1 or len(fds) != expected:
            for fd in fds:
                os.close(fd)
            why = f"zygote has {threads} threads" if threads != 1 else f"expected {expected} fds"
            _send(sock, {"id": rid, "error": why})
            if threads != 1:
                return None  # refuse to fork ever again; the host starts a fresh zygote
            continue
        worker = _fork_worker(sock, fds, req, host_pid)
        if worker is not None:
            return worker


def _fd_count(req: dict[str, Any]) -> int:
    """Descriptors a request must carry: stdio, and for a confined start the walls' memfd and
    the descriptors its walls name."""
    confined = req.get("walls")
    if not isinstance(confined, dict):
        return 3
    return 4 + len(confined.get("fds", ()))


def _fork_worker(
    sock: socket.socket, fds: list[int], req: dict[str, Any], host_pid: int
) -> dict[str, Any] | None:
    """Double fork; returns the request in the worker, None in the zygote.

    The worker itself reports its pid to the host once it is the host's child, so a zygote that
    dies mid-request cannot lose a worker: one that cannot report exits before it is a worker.
    The zygote answers only when the fork failed.
    """
    rid = req["id"]
    if _SPARE and req.get("spare") == _SPARE[0] and _served_by_spare(sock, req, fds):
        for fd in fds:
            os.close(fd)
        return None
    try:
        mid = os.fork()
    except OSError as exc:
        for fd in fds:
            os.close(fd)
        _send(sock, {"id": rid, "error": f"fork failed: {exc}"})
        return None
    if mid == 0:  # the intermediate: fork the worker and exit at once (-> adoption by the host)
        code = 0
        try:
            pid = os.fork()
            if pid == 0:
                _become_worker(sock, fds, req, host_pid)
                return req
        except BaseException:  # whatever happens, the intermediate exits
            code = 1
        os._exit(code)
    for fd in fds:
        os.close(fd)
    _pid, status = os.waitpid(mid, 0)
    if status != 0:
        _send(sock, {"id": rid, "error": f"intermediate fork failed (status {status})"})
    return None


def _new_spare(sock: socket.socket, msg: dict[str, Any], host_pid: int) -> bool:
    """Fork a spare for the group whose ``cgroup.procs`` is ``msg["procs"]`` (the previous
    spare, if any, is ended). True in a worker forked from it (``msg["worker"]`` is its
    request), False in the zygote."""
    _drop_spare()
    n, procs = int(msg["spare"]), str(msg["procs"])
    zygote_pid = os.getpid()
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        pid = os.fork()
    except OSError:
        ours.close()
        theirs.close()
        return False
    if pid == 0:  # the spare never returns to the zygote's loop: only a worker forked from it
        try:
            ours.close()
            msg["worker"] = _spare(sock, theirs, n, procs, zygote_pid, host_pid)
        except BaseException:
            os._exit(1)
        return True
    theirs.close()
    _SPARE[:] = [n, pid, ours]
    return False


def _spare(
    sock: socket.socket,
    own: socket.socket,
    n: int,
    procs: str,
    zygote_pid: int,
    host_pid: int,
) -> dict[str, Any]:
    """The spare: join the group now, wait for the request the zygote forwards, fork the
    worker inside the group and exit; returns the request in the worker."""
    if not linux.die_with_parent(zygote_pid):
        os._exit(1)
    try:
        fd = os.open(procs, os.O_WRONLY | os.O_CLOEXEC)
        try:
            os.write(fd, b"%d" % os.getpid())
        finally:
            os.close(fd)
    except OSError as exc:
        with contextlib.suppress(OSError):
            _send(sock, {"spare": n, "error": f"{procs}: {exc.strerror or exc}"})
        os._exit(SPARE_UNJOINED)
    with contextlib.suppress(OSError):
        _send(sock, {"spare": n, "pid": os.getpid()})
    while True:
        try:
            msg, fds, _flags, _addr = socket.recv_fds(own, MAX_MESSAGE, MAX_FDS)
            break
        except InterruptedError:
            continue
        except OSError:
            os._exit(SPARE_NO_FORK)  # nothing forked: the zygote serves the request itself
    if not msg:  # the zygote dropped this spare, or is gone
        os._exit(0)
    own.close()
    req: dict[str, Any] = json.loads(msg)
    req["joined"] = procs
    try:
        pid = os.fork()
    except OSError:
        os._exit(SPARE_NO_FORK)
    if pid == 0:
        _become_worker(sock, fds, req, host_pid)
        return req
    os._exit(0)


def _served_by_spare(sock: socket.socket, req: dict[str, Any], fds: list[int]) -> bool:
    """Forward a fork request to the spare (used up by it either way). True when that settled
    the request (the spare forked the worker, or ended without saying why: then the zygote
    answers with the error); False when the zygote must fork the intermediate itself (the spare
    was gone, could not join its group or could not fork)."""
    _n, pid, own = _SPARE
    _SPARE.clear()
    try:
        socket.send_fds(own, [json.dumps(req).encode()], fds)
        sent = True
    except OSError:
        sent = False
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    own.close()
    try:
        _pid, status = os.waitpid(pid, 0)
    except ChildProcessError:
        return False
    code = os.waitstatus_to_exitcode(status)
    if not sent or code in (SPARE_UNJOINED, SPARE_NO_FORK):
        return False
    if code != 0:
        _send(sock, {"id": req["id"], "error": f"the spare failed (status {code})"})
    return True


def _drop_spare() -> None:
    """End the spare, if any (it has forked nothing)."""
    if not _SPARE:
        return
    _n, pid, own = _SPARE
    _SPARE.clear()
    own.close()
    with contextlib.suppress(OSError):
        os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(OSError):
        os.waitpid(pid, 0)


def _become_worker(sock: socket.socket, fds: list[int], req: dict[str, Any], host_pid: int) -> None:
    """Turn this grandchild into what an exec'd worker would be (everything but ``__main__``)."""
    # 1. Wait to be adopted by the host (the intermediate exits right after the fork), then die
    #    with it. If we end up anywhere else the host is gone: leave.
    mid = os.getppid()
    deadline = time.monotonic() + ADOPT_DEADLINE_S
    while os.getppid() == mid and mid != host_pid:
        if time.monotonic() > deadline:
            os._exit(1)
        time.sleep(0.0002)
    if not linux.die_with_parent(host_pid) or os.getppid() != host_pid:
        os._exit(1)
    # 2. Tell the host who we are. If it no longer listens (it gave up on this request and
    #    restarted the zygote), leave now, before the new session: the host reaps us as an
    #    adopted orphan.
    try:
        sock.send(json.dumps({"id": req["id"], "pid": os.getpid()}).encode())
    except OSError:
        os._exit(1)
    # 3. A new session and process group, like start_new_session=True.
    os.setsid()
    # 4. stdio on 0/1/2, every other fd closed but a confined start's walls. The zygote's socket
    #    object gives up its fd first so that no finaliser closes a number the worker reuses.
    sock.detach()
    for target, fd in enumerate(fds[:3]):
        if fd != target:
            os.dup2(fd, target)
    _close_all_but(fds[3:])
    # 5. Signal dispositions of a fresh interpreter, empty mask, no wakeup fd.
    signal.set_wakeup_fd(-1)
    for sig, handler in _FRESH_SIGNALS.items():
        try:
            signal.signal(sig, handler)
        except (OSError, ValueError, TypeError):
            continue
    signal.pthread_sigmask(signal.SIG_SETMASK, set())
    # 6. Environment (os.environ and the C environ), cwd, umask, rlimits.
    env = req["env"]
    os.environ.clear()
    os.environ.update(env)
    if hasattr(time, "tzset"):
        time.tzset()
    tempfile = sys.modules.get("tempfile")
    if tempfile is not None:
        tempfile.tempdir = None  # type: ignore[attr-defined]
    os.chdir(req["cwd"])
    os.umask(int(req["umask"]))
    linux.set_rlimits(req["rlimits"])
    # 7. The walls, before the worker's first instruction; an exec'd program now replaces us.
    if req.get("walls") is not None:
        _put_up_walls(fds[3:], req["walls"]["fds"], req.get("joined", ""))
    if req.get("exec"):
        _execve(req["argv"], env)
    # 8. argv, sys.path and a fresh __main__ as the interpreter makes them for ``-m mod`` /
    #    ``script`` (shared with the exec shim's ``--python`` form); a fresh random state.
    argv = req["argv"]
    pymain.enter(argv, argv[1:], _FRESH_PATH, safe_path=False)
    importlib.invalidate_caches()
    random.seed()


def _close_all_but(keep: list[int]) -> None:
    """Close every descriptor from 3 up but ``keep``."""
    low = 3
    for fd in sorted(keep):
        if fd >= low:
            os.closerange(low, fd)
            low = fd + 1
    os.closerange(low, _fd_ceiling())


def _fail(message: str) -> NoReturn:
    """End the worker as the exec shim does: one line on stderr, status 126."""
    try:
        os.write(2, f"toolhost: {message}\n".encode(errors="replace"))
    finally:
        os._exit(CONFINEMENT_FAILED)


def _put_up_walls(fds: list[int], host_fds: list[int], joined: str = "") -> None:
    """Read the walls from the memfd (``fds[0]``), give them this process's numbers of the
    descriptors they name (``fds[1:]``, which the host numbered ``host_fds``), and put them up
    (the code the exec shim runs); close what is left of them. A failure ends the worker.
    ``joined``: the ``cgroup.procs`` of the group the spare forked this worker in (its walls
    then skip that join)."""
    memfd, passed = fds[0], fds[1:]
    try:
        size = os.fstat(memfd).st_size
        data = b""
        while len(data) < size:  # pread: the file offset is shared with the host
            chunk = os.pread(memfd, size - len(data), len(data))
            if not chunk:
                break
            data += chunk
        w = walls.Walls.loads(data)
        mine = dict(zip(host_fds, passed, strict=True))
        if w.ruleset_fd >= 0:
            w.ruleset_fd = mine[w.ruleset_fd]
        w.netns_fds = [mine[fd] for fd in w.netns_fds]
        if w.channel >= 0:
            w.channel = mine[w.channel]
        w.cgroup_joined = bool(joined) and w.cgroup_procs == joined
    except (OSError, ValueError, KeyError, TypeError, EOFError) as exc:
        _fail(f"confinement failed: the walls did not arrive ({exc!r})")
    try:
        walls.arm(w).apply()
    except walls.ConfinementError as exc:  # "step: why"
        _fail(f"confinement failed: {exc.strerror}")
    except OSError as exc:
        _fail(f"confinement failed: {exc}")
    for fd in fds:  # what the walls did not consume (the memfd, a ruleset never entered)
        try:
            os.close(fd)
        except OSError:
            pass


def _execve(argv: list[str], env: dict[str, str]) -> None:
    """Replace this worker with ``argv`` (looked up on the worker's PATH when bare), with the
    signal dispositions an exec from the host gives (``SIGPIPE`` and ``SIGXFSZ`` back to
    default, as ``subprocess`` restores them)."""
    for name in ("SIGPIPE", "SIGXFZ", "SIGXFSZ"):
        sig = getattr(signal, name, None)
        if sig is not None:
            signal.signal(sig, signal.SIG_DFL)
    try:
        os.execvpe(argv[0], argv, env)
    except OSError as exc:
        _fail(f"cannot execute {argv[0]}: {exc.strerror or exc}")


def _fd_ceiling() -> int:
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft > 1 << 20:
        return 1 << 20
    return max(soft, 256)


def run_worker(req: dict[str, Any]) -> None:
    """Run the worker's module or script as ``__main__`` (in the forked worker).

    An uncaught exception is printed from the worker's own frames and ends the process with
    status 1, exactly as ``python -m`` would; ``SystemExit`` ends the process with its code
    (:func:`supervisor.processes.pymain.run`).
    """
    pymain.run(req["module"], req["argv"][1])
