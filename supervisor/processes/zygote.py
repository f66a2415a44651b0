"""The host's side of the zygote: start and supervise it, ask it for workers, adopt and reap them.

# Strategy (docs/zygote.md): one zygote per host process (Linux only), started from the trio
# thread like every worker (PDEATHSIG follows the forking thread), registered with the warden, and
# given one end of an unnamed SOCK_SEQPACKET socketpair as fd 3. The host hands its zygote to its
# workers inside their ``Spawner``, whose ``spawn`` calls :meth:`Zygote.fork` synchronously,
# like ``Popen``: it sends one message and the worker's three pipe ends (SCM_RIGHTS) and waits
# for the pid at most ``replyTimeoutMs``; anything else (not started, dead, slow, a worker that
# does not qualify) returns a reason and the caller execs. The zygote double-forks, so every
# worker is adopted by the host, which is a child subreaper: the worker is a
# :class:`~supervisor.processes.child.Child` like an exec'd one, the host reaps it and learns its
# exit status itself, and a dead zygote loses nothing. Becoming a subreaper also adopts the
# orphans of sidecars' own children; those are reaped here
# (:func:`supervisor.processes.linux.reap_orphans`), never a process that some ``Popen`` waits for.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import trio

from supervisor.contracts.registry import RestartConfig
from supervisor.contracts.snapshot import ZygoteStatus
from supervisor.policy import restart
from supervisor.policy.spawn import startup_env_difference
from supervisor.processes import linux
from supervisor.processes.child import Child
from supervisor.processes.confine_spawn import Prepared
from supervisor.processes.limits import host_limits
from supervisor.processes.pids_cgroup import PidsCgroups
from supervisor.processes.spawn import allowed_env
from supervisor.processes.warden import Warden, process_warden
from supervisor.processes.zygote_main import ZYGOTE_FD
from supervisor.processes.zygote_spare import Spare

log = logging.getLogger("toolhost.zygote")

DEFAULT_PRELOAD = ("sidecars.sdk",)
CHECK_INTERVAL_S = 1.0
STALL_S = 5.0
"""A zygote that leaves a request unanswered this long is killed and started afresh."""
RESTART = RestartConfig(backoff_ms=100, max_backoff_ms=5000, intensity=5, period_ms=60_000)

ROOT = str(Path(__file__).resolve().parents[2])
"""The folder holding the ``supervisor`` package (put first on the zygote's path to boot)."""
_BOOT = (
    "import sys\n"
    "fresh = sys.path[1:]\n"
    "sys.path.insert(0, {root!r})\n"
    "from supervisor.processes.zygote_main import main, run_worker\n"
    "req = main(sys.argv[1:], fresh)\n"
    "if req is not None:\n"
    "    del main, fresh\n"
    "    run_worker(req)\n"
)


def preload_list(extra: Sequence[str]) -> list[str]:
    """The SDK first, then the configured modules, without duplicates."""
    return list(dict.fromkeys([*DEFAULT_PRELOAD, *extra]))


def platform_problem() -> str | None:
    """Why this platform cannot run a zygote (None: it can)."""
    if not sys.platform.startswith("linux"):
        return f"the zygote needs Linux (this is {sys.platform})"
    if not hasattr(os, "pidfd_open"):
        return "os.pidfd_open is missing (Python >= 3.9 on Linux >= 5.3)"
    if not hasattr(socket, "send_fds"):
        return "socket.send_fds is missing (Python >= 3.9)"
    if linux.PRCTL is None:
        return "prctl is not available"
    return None


class Zygote:
    """The zygote of this host process and the numbers ``status`` shows about it.

    Args:
        preload: Modules imported before forking (the SDK is always first).
        reply_timeout_s: How long a spawn waits for the zygote's answer before it execs.
        app_root: The zygote's cwd.
        on_change: Called whenever :attr:`state` changes.
        warden: The warden the zygote and its workers are registered with (default: this
            process's).
    """

    def __init__(
        self,
        preload: Sequence[str] = (),
        *,
        reply_timeout_s: float = 0.1,
        app_root: str = ".",
        on_change: Callable[[], None] | None = None,
        warden: Warden | None = None,
    ) -> None:
        self.preload = preload_list(preload)
        self.reply_timeout_s = reply_timeout_s
        self.app_root = app_root
        self._state = "starting"
        self._on_change = on_change
        self.reason: str | None = None
        self.last_fallback: str | None = None
        self.forks = 0
        self.execs = 0
        """Confined programs the zygote forked, walled and exec'd (not in ``forks``)."""
        self.fallbacks = 0
        self.restarts = 0
        self.hello: dict[str, Any] = {}
        self._popen: subprocess.Popen[bytes] | None = None
        self._sock: socket.socket | None = None
        self._env: dict[str, str] = {}
        self._next_id = 0
        self._pending: set[int] = set()
        self._stalled = 0
        self._mtimes: dict[str, float] = {}
        self._shadow_cache: dict[str, str | None] = {}
        self._replace = trio.Event()
        self._rng = random.Random()
        self._restart_state = restart.RestartState()
        self._warden = warden if warden is not None else process_warden()
        self.spare = Spare()
        """The spare: the next confined worker's pids group, joined ahead (cgroup v1's
        migration off the critical path; :mod:`supervisor.processes.zygote_spare`)."""

    @property
    def state(self) -> str:
        """``starting``, ``ready``, ``restarting``, ``unavailable`` or ``off``."""
        return self._state

    @state.setter
    def state(self, value: str) -> None:
        if value != self._state:
            self._state = value
            if self._on_change is not None:
                self._on_change()

    # status --------------------------------------------------------------------------------

    @property
    def pid(self) -> int | None:
        return self._popen.pid if self._popen is not None else None

    def status(self) -> ZygoteStatus:
        rss = None
        if self.pid is not None:
            with (
                contextlib.suppress(OSError, ValueError, IndexError),
                open(f"/proc/{self.pid}/statm") as f,
            ):
                rss = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        return ZygoteStatus(
            state=self.state,
            pid=self.pid if self.state == "ready" else None,
            rssBytes=rss if self.state == "ready" else None,
            forks=self.forks,
            fallbacks=self.fallbacks,
            restarts=self.restarts,
            preloaded=list(self.hello.get("preloaded", [])),
            preloadFailed=[f"{b['module']}: {b['error']}" for b in self.hello.get("failed", [])],
            reason=self.reason or self.last_fallback,
        )

    # qualification ---------------------------------------------------------------------------

    def unqualified(self, argv: Sequence[str], cwd: str, env: Mapping[str, str]) -> str | None:
        """Why a worker with this argv/cwd/env must be exec'd (None: the zygote can fork it)."""
        if len(argv) < 2 or os.path.realpath(argv[0]) != os.path.realpath(sys.executable):
            return "the command is not the host's python"
        if argv[1] == "-m":
            if len(argv) < 3:
                return "python -m without a module"
            path0 = cwd
        elif argv[1].startswith("-"):
            return f"interpreter flag {argv[1]}"
        else:
            script = argv[1] if os.path.isabs(argv[1]) else os.path.join(cwd, argv[1])
            path0 = os.path.dirname(os.path.realpath(script))
        key = startup_env_difference(env, self._env)
        if key is not None:
            return f"environment variable {key} differs from the zygote's"
        return self._shadowed(path0)

    def _shadowed(self, path0: str) -> str | None:
        if path0 in self._shadow_cache:
            return self._shadow_cache[path0]
        why = None
        for name, folder in self.hello.get("tops", {}).items():
            if folder == path0:
                continue
            if os.path.isdir(os.path.join(path0, name)) or os.path.exists(
                os.path.join(path0, name + ".py")
            ):
                why = f"{path0} has its own {name}, which the zygote preloaded from {folder}"
                break
        self._shadow_cache[path0] = why
        return why

    # forking (synchronous, on the trio thread, like Popen) -----------------------------------

    def take_spare(self, cgroups: PidsCgroups, limit: int) -> str | None:
        """A confined start's pids group, already joined by the zygote's spare, ``pids.max``
        set to ``limit`` (None: no spare now: make a fresh group). Name it in the walls of the
        very next :meth:`fork`; the caller owns the group (and removes it). On unless
        ``TOOLHOST_ZYGOTE_SPARE=0`` (:func:`spares_off`)."""
        if self.state != "ready" or spares_off():
            return None
        return self.spare.take(cgroups, limit)

    def fork(
        self,
        argv: Sequence[str],
        *,
        cwd: str,
        env: Mapping[str, str],
        limits: Sequence[tuple[int, int, int]],
        walls: Prepared | None = None,
        run: bool = True,
        stdin: bool = True,
        stdout: bool = True,
        stderr: bool = True,
    ) -> tuple[Child | None, str]:
        """Ask the zygote for a worker; ``(child, "")`` or ``(None, why it must be exec'd)``.

        Args:
            argv: Program and arguments.
            cwd: Working directory.
            env: The complete environment.
            limits: ``(resource, soft, hard)`` rlimits.
            walls: A confined start's walls (PROTOCOL 7): sent with the request, put up by the
                worker before its first instruction. A confined worker that cannot run in the
                zygote's interpreter is forked, walled and ``execve`` d there (``startedBy:
                exec``; the second value then says why it was not run in the interpreter).
            run: The worker may run in the zygote's preloaded interpreter (``spawn: auto``).
            stdin: Give the worker a stdin pipe (else /dev/null).
            stdout: Give the worker a stdout pipe (else /dev/null).
            stderr: Give the worker a stderr pipe (else /dev/null).
        """
        spare = self.spare.claim(walls.cgroup) if walls is not None else None
        if self.state != "ready" or self._sock is None:
            return None, f"zygote {self.state}" + (f" ({self.reason})" if self.reason else "")
        if not argv:
            return None, "no command"
        why = "the worker's sidecar does not allow forking" if not run else None
        if why is None and not (stdin and stdout and stderr):
            why = "a worker without stdio pipes"
        if why is None:
            why = self.unqualified(argv, cwd, env)
        if why is not None and walls is None:
            return None, why
        self._collect_late()
        if self._pending:
            return None, "the zygote has not answered an earlier request yet"
        self._next_id += 1
        rid = self._next_id
        execve = why is not None
        module = argv[2] if not execve and argv[1] == "-m" else None
        mask = linux.current_umask()
        rl = host_limits()
        for which, soft, hard in limits:
            rl[which] = (soft, hard)
        req: dict[str, Any] = {
            "id": rid,
            "argv": list(argv),
            "module": module,
            "cwd": cwd,
            "env": dict(env),
            "umask": mask,
            "rlimits": [[w, s, h] for w, (s, h) in rl.items()],
        }
        if execve:
            req["exec"] = True
        extra: list[int] = []
        if walls is not None:
            req["walls"] = {"fds": list(walls.inherited)}
            extra = [walls.walls_fd, *walls.inherited]
        if spare is not None:
            req["spare"] = spare
        fds: list[int] = []
        ours: list[int | None] = []
        theirs: list[int] = []
        try:
            for i, wanted in enumerate((stdin, stdout, stderr)):
                if not wanted:  # /dev/null, as an exec'd child gets it
                    null = os.open(os.devnull, (os.O_WRONLY if i else os.O_RDONLY) | os.O_CLOEXEC)
                    fds.append(null)
                    ours.append(None)
                    theirs.append(null)
                    continue
                r, w = os.pipe()
                fds += (r, w)
                mine, child_end = (r, w) if i else (w, r)
                os.set_inheritable(mine, False)
                ours.append(mine)
                theirs.append(child_end)
            socket.send_fds(self._sock, [json.dumps(req).encode()], [*theirs, *extra])
        except OSError as exc:
            for fd in fds:
                with contextlib.suppress(OSError):
                    os.close(fd)
            self._lost(f"request failed: {exc}")
            return None, f"zygote request failed: {exc}"
        for fd in theirs:
            os.close(fd)
        self._pending.add(rid)
        reply = self._await_reply(rid)
        if reply is not None:
            self._pending.discard(rid)
        if reply is None or "pid" not in reply:
            for end in ours:
                if end is not None:
                    os.close(end)
            if reply is None:
                return None, f"zygote did not answer within {self.reply_timeout_s * 1000:.0f} ms"
            return None, f"zygote refused: {reply.get('error')}"
        pid = int(reply["pid"])
        self._warden.watch(pid)
        if execve:
            self.execs += 1
        else:
            self.forks += 1
        in_w, out_r, err_r = (trio.lowlevel.FdStream(fd) if fd is not None else None for fd in ours)
        child = Child(
            pid,
            in_w,
            out_r,
            err_r,
            started_by="exec" if execve else "zygote",
            warden=self._warden,
        )
        return child, why or ""

    def _await_reply(self, rid: int) -> dict[str, Any] | None:
        sock = self._sock
        assert sock is not None
        deadline = time.monotonic() + self.reply_timeout_s
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            ready, _, _ = select.select([sock], [], [], left)
            if not ready:
                return None
            msg = self._recv()
            if msg is None:
                return None
            if msg.get("id") == rid:
                return msg
            self._late(msg)

    def _recv(self) -> dict[str, Any] | None:
        sock = self._sock
        if sock is None:
            return None
        try:
            data = sock.recv(1 << 20, socket.MSG_DONTWAIT)
        except BlockingIOError:
            return {}
        except OSError as exc:
            self._lost(f"socket error: {exc}")
            return None
        if not data:
            self._lost("the zygote closed its socket")
            return None
        try:
            msg = json.loads(data)
        except ValueError:
            return {}
        return msg if isinstance(msg, dict) else {}

    def _late(self, msg: dict[str, Any]) -> None:
        """An answer to a request the host stopped waiting for: that worker is not wanted.
        (Or the spare's report.)"""
        if "spare" in msg:
            self.spare.report(msg)
            return
        rid = msg.get("id")
        if rid not in self._pending:
            return
        self._pending.discard(rid)
        if self._on_change is not None:
            self._on_change()
        pid = msg.get("pid")
        if isinstance(pid, int):
            with contextlib.suppress(OSError):
                os.killpg(pid, signal.SIGKILL)
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError, OSError):
                os.waitpid(pid, 0)

    def _collect_late(self) -> None:
        sock = self._sock
        while self._pending and sock is not None:
            ready, _, _ = select.select([sock], [], [], 0)
            if not ready:
                return
            msg = self._recv()
            if not msg:
                return
            self._late(msg)

    def _lost(self, why: str) -> None:
        if self.state == "ready":
            log.warning("zygote: %s; workers are exec'd until it is back", why)
        self.state = "restarting"
        self.reason = why
        popen = self._popen
        if popen is not None and popen.poll() is None:
            with contextlib.suppress(OSError):
                popen.kill()

    def fell_back(self, why: str) -> None:
        """Count (and log once per start) a worker exec'd although its sidecar allows forking."""
        self.fallbacks += 1
        self.last_fallback = f"last fallback to exec: {why}"
        log.info("zygote: worker exec'd instead: %s", why)

    # supervision -------------------------------------------------------------------------------

    def replace(self) -> None:
        """Start a fresh zygote (a reload; preloaded code changed on disk); until it is ready,
        workers are exec'd, so none starts from stale preloaded code."""
        if self.state == "ready":
            self.state, self.reason = "restarting", "being replaced"
        self._replace.set()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Start the zygote and keep one running (restart policy with backoff) until cancelled.

        Where the platform cannot run one it stays ``unavailable`` (every start is exec'd and
        counted as a fallback). Either way it is this process's zygote until cancelled
        (:func:`running_here`).
        """
        _RUNNING.append(self)
        try:
            problem = platform_problem() or linux.set_subreaper(True)
            if problem is not None:
                self.state, self.reason = "unavailable", problem
                task_status.started()
                await trio.sleep_forever()
            await self._keep_one(task_status)
        finally:
            _RUNNING.remove(self)

    async def _keep_one(self, task_status: trio.TaskStatus[None]) -> None:
        started = False
        try:
            while True:
                t0 = trio.current_time()
                await self._start()
                if not started:
                    started = True
                    task_status.started()
                await self._serve()
                self._stop_process()
                if self._replace.is_set():
                    self._replace = trio.Event()
                    self.restarts += 1
                    continue
                decision, self._restart_state = restart.on_exit(
                    RESTART,
                    self._restart_state,
                    now=trio.current_time() * 1000.0,
                    uptime_ms=(trio.current_time() - t0) * 1000.0,
                    clean=False,
                    rng=self._rng,
                )
                self.restarts += 1
                self.state = "restarting"
                await trio.sleep(decision.delay_ms / 1000.0)
        finally:
            self._stop_process()
            self.state = "off"
            linux.set_subreaper(False)  # the workers are gone; stop adopting orphans
            linux.reap_orphans()

    async def _start(self) -> None:
        self.state = "starting"
        self._shadow_cache.clear()
        self._pending.clear()
        self.hello = {}
        host_end = self._launch()
        if host_end is None:
            return
        with trio.move_on_after(10):
            await trio.lowlevel.wait_readable(host_end)
            msg = self._recv()
            if msg and msg.get("hello"):
                self.hello = msg
                self._mtimes = _mtimes(msg.get("files", []))
                self.state, self.reason = "ready", None
                for bad in msg.get("failed", []):
                    log.warning("zygote: preload of %s failed: %s", bad["module"], bad["error"])
                return
        self._lost("no hello from the zygote")

    def _launch(self) -> socket.socket | None:
        """Fork the zygote (on the trio thread, like a worker) with its end of the socketpair."""
        host_end, child_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._env = allowed_env(os.environ, {})
        w = self._warden
        w.start()
        try:
            os.set_inheritable(child_end.fileno(), True)
            fd = child_end.fileno()
            preexec = linux.make_preexec(())

            def child_setup() -> None:
                if fd != ZYGOTE_FD:
                    os.dup2(fd, ZYGOTE_FD)
                preexec()

            self._popen = subprocess.Popen(
                [sys.executable, "-c", _BOOT.format(root=ROOT), *self.preload],
                cwd=self.app_root,
                env=self._env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
                pass_fds=(fd, ZYGOTE_FD) if fd != ZYGOTE_FD else (fd,),
                preexec_fn=child_setup,
            )
        except OSError as exc:
            host_end.close()
            self.state, self.reason = "restarting", f"cannot start: {exc}"
            return None
        finally:
            child_end.close()
        w.watch(self._popen.pid)
        linux.own_child(self._popen.pid)  # its Popen reaps it, not the orphan reaper
        host_end.setblocking(False)  # a full buffer (a hung zygote) must not block the host
        self._sock = host_end
        self._stalled = 0
        return host_end

    async def _serve(self) -> None:
        """Until the zygote dies or must be replaced: collect late answers, reap adopted orphans,
        watch the preloaded files."""
        popen, sock = self._popen, self._sock
        if popen is None or sock is None or self.state != "ready":
            return
        pidfd = os.pidfd_open(popen.pid)
        try:
            while not self._replace.is_set() and self.state == "ready":
                with trio.move_on_after(CHECK_INTERVAL_S):
                    async with trio.open_nursery() as n:

                        async def dead() -> None:
                            await trio.lowlevel.wait_readable(pidfd)
                            n.cancel_scope.cancel()

                        async def readable() -> None:
                            await trio.lowlevel.wait_readable(sock)
                            n.cancel_scope.cancel()

                        async def replace() -> None:
                            await self._replace.wait()
                            n.cancel_scope.cancel()

                        async def spare() -> None:
                            await self.spare.wanted.wait()
                            n.cancel_scope.cancel()

                        n.start_soon(dead)
                        n.start_soon(readable)
                        n.start_soon(replace)
                        n.start_soon(spare)
                if popen.poll() is not None:
                    self._lost(f"the zygote exited ({popen.returncode})")
                    return
                msg = self._recv()
                if msg:
                    self._late(msg)
                if self._pending:
                    self._stalled += 1
                    if self._stalled * CHECK_INTERVAL_S >= STALL_S:
                        self._lost(f"no answer for {STALL_S:.0f} s")
                        return
                else:
                    self._stalled = 0
                linux.reap_orphans()
                self._ask_spare()
                if _mtimes(self._mtimes) != self._mtimes:
                    log.info("zygote: preloaded code changed on disk; starting a fresh zygote")
                    self.replace()
        finally:
            os.close(pidfd)

    def _ask_spare(self) -> None:
        """Ask the zygote for the next spare when one is wanted."""
        if not self.spare.wanted.is_set():
            return
        msg = self.spare.request()
        sock = self._sock
        if msg is None or sock is None:
            return
        try:
            sock.send(json.dumps(msg).encode())
        except OSError as exc:
            self.spare.discard()
            self._lost(f"request failed: {exc}")

    def _stop_process(self) -> None:
        self.spare.discard()  # kills an untaken spare with its group
        sock = self._sock
        if sock is not None:
            # No worker may report after this (its send fails and it exits before it is a
            # worker); the reports already queued are late answers: kill those workers.
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RD)
            while self._pending:
                try:
                    data = sock.recv(1 << 20, socket.MSG_DONTWAIT)
                except OSError:
                    break
                if not data:
                    break
                with contextlib.suppress(ValueError):
                    msg = json.loads(data)
                    if isinstance(msg, dict):
                        self._late(msg)
            self._sock = None
            sock.close()
        self._pending.clear()
        popen, self._popen = self._popen, None
        if popen is None:
            return
        if popen.poll() is None:
            with contextlib.suppress(OSError):
                os.killpg(popen.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            popen.wait(timeout=2)
        linux.disown_child(popen.pid)  # reaped, or left to the orphan reaper
        self._warden.forget(popen.pid)


def _mtimes(files: Any) -> dict[str, float]:
    out: dict[str, float] = {}
    for path in files:
        try:
            out[path] = os.stat(path).st_mtime
        except OSError:
            out[path] = -1.0
    return out


_RUNNING: list[Zygote] = []
"""The zygote :meth:`Zygote.run` runs in this process (one at most: :func:`running_here`)."""


def running_here() -> bool:
    """Whether this process runs a zygote already.

    One per process: the child-subreaper flag it sets, and the orphans that flag adopts, belong
    to the process. A second host in the same process execs its workers (its zygote is off).
    """
    return bool(_RUNNING)


def spares_off() -> bool:
    """``TOOLHOST_ZYGOTE_SPARE=0`` in the host's environment turns the zygote's spare off: every
    confined worker joins a fresh pids group itself (the cgroup v1 migration on its start)."""
    return os.environ.get("TOOLHOST_ZYGOTE_SPARE", "").strip().lower() in ("0", "off", "false")


def forced_exec() -> bool:
    """``TOOLHOST_SPAWN=exec`` in the host's environment turns the zygote off (the CI switch)."""
    return os.environ.get("TOOLHOST_SPAWN", "").strip().lower() == "exec"
