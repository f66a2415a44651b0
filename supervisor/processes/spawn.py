"""How a sidecar process starts: exec, or a fork from the host's zygote, chosen by a Spawner.

# Strategy: the host makes one :class:`Spawner` when it starts, holding its zygote when it runs
# one, and hands it down in every worker's launch description; nothing looks the zygote up in a
# module global. :meth:`Spawner.spawn` is synchronous, like ``Popen``, and runs on the trio
# thread: trio's ``open_process`` forks from a worker thread, and ``PR_SET_PDEATHSIG`` fires when
# the *thread* that forked exits, which trio's thread cache does after idling. So a child is
# forked here (a millisecond, and rare) in its own session (process group == pid), with
# PDEATHSIG=SIGKILL and its rlimits set between fork and exec (:mod:`supervisor.processes.linux`),
# an allow-listed environment, and its group registered with the warden. A sidecar that allows
# forking (``spawn: auto``) is first offered to the zygote, which answers with a child or with
# why it cannot (then this start is exec'd and the zygote counts the fallback). A confined start
# (PROTOCOL 7) goes to the zygote too, whatever its program: its child puts the walls up, then
# runs the Python worker or execs the program; only when the zygote cannot take it (none,
# ``TOOLHOST_SPAWN=exec``, down, slow) is it exec'd through the shim, a bare interpreter that
# puts them up (``confine_exec.py``; the host moves it into its pids group from a thread while
# it starts, ``Prepared.host_join``); a Python worker of the host's own interpreter, where its
# start reads nothing a worker could write, starts that interpreter on the shim instead (one
# start, not two: ``processes.confine_direct``). The zygote is seen through :class:`Forker`, so
# this module does not import it (the zygote imports :func:`allowed_env` from here).
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from typing import Protocol

import trio

from supervisor.policy.paths import host_path
from supervisor.processes.child import Child
from supervisor.processes.confine_spawn import Prepared, SidecarConfinement
from supervisor.processes.linux import make_preexec
from supervisor.processes.pids_cgroup import PidsCgroups
from supervisor.processes.warden import Warden, process_warden

ENV_ALLOW = ("PATH", "HOME", "LANG", "TZ", "TMPDIR")  # PROTOCOL 3, exactly (plus LC_*)
ENV_ALLOW_PREFIXES = ("LC_",)


def allowed_env(base: Mapping[str, str], extra: Mapping[str, str]) -> dict[str, str]:
    """The environment a sidecar gets: the allow-list from ``base`` (with the host's interpreter
    folder first on PATH, as commands are resolved: policy.paths.host_path), then ``extra``."""
    env = {k: v for k, v in base.items() if k in ENV_ALLOW or k.startswith(ENV_ALLOW_PREFIXES)}
    env["PATH"] = host_path(base.get("PATH"), sys.executable)
    env.update(extra)
    return env


class Forker(Protocol):
    """What forks workers: the host's zygote (:class:`~supervisor.processes.zygote.Zygote`)."""

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
        """``(child, "")``, or ``(None, why this start must be exec'd)``; with ``walls``, a
        child exec'd by the zygote may come with why it was not run in its interpreter."""
        ...

    def fell_back(self, why: str) -> None:
        """Count a start that was exec'd although its sidecar allows forking."""
        ...

    def take_spare(self, cgroups: PidsCgroups, limit: int) -> str | None:
        """A pids group the zygote's spare joined ahead, ``pids.max`` = ``limit``, for the
        next confined fork (None: none now)."""
        ...


def exec_child(
    argv: Sequence[str],
    *,
    cwd: str,
    env: Mapping[str, str],
    limits: Sequence[tuple[int, int, int]] = (),
    stdin: bool = True,
    stdout: bool = True,
    stderr: bool = True,
    warden: Warden,
    pass_fds: Sequence[int] = (),
) -> Child:
    """Fork and exec ``argv`` in its own session with pipes; it never outlives the host.

    Args:
        argv: Program and arguments (``argv[0]`` already resolved).
        cwd: Working directory.
        env: The complete environment.
        limits: ``(resource, soft, hard)`` rlimits applied before exec.
        stdin: Give the child a stdin pipe (else /dev/null).
        stdout: Give the child a stdout pipe (else /dev/null).
        stderr: Give the child a stderr pipe (else /dev/null).
        warden: The warden the child's group is registered with.
        pass_fds: Descriptors the child inherits (a confined start's walls).

    Raises:
        OSError: The program could not be executed (the message names it).
    """
    warden.start()
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
            pass_fds=tuple(pass_fds),
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
    warden.watch(popen.pid)
    return Child(
        popen.pid,
        trio.lowlevel.FdStream(in_w) if stdin else None,
        trio.lowlevel.FdStream(out_r) if stdout else None,
        trio.lowlevel.FdStream(err_r) if stderr else None,
        started_by="exec",
        warden=warden,
        popen=popen,
    )


class Spawner:
    """How this host starts sidecar processes: exec, or a fork from its zygote when it has one.

    Args:
        zygote: The host's zygote (None: every process is exec'd).
        warden: The warden every new process group is registered with (default: this
            process's, :func:`supervisor.processes.warden.process_warden`).
    """

    __slots__ = ("warden", "zygote")

    def __init__(self, zygote: Forker | None = None, *, warden: Warden | None = None) -> None:
        self.zygote = zygote
        self.warden = warden if warden is not None else process_warden()

    def spawn(
        self,
        argv: Sequence[str],
        *,
        cwd: str,
        env: Mapping[str, str],
        limits: Sequence[tuple[int, int, int]] = (),
        stdin: bool = True,
        stdout: bool = True,
        stderr: bool = True,
        may_fork: bool = False,
        confine: SidecarConfinement | None = None,
    ) -> Child:
        """Start ``argv`` in its own session with pipes; it never outlives the host.

        Args:
            argv: Program and arguments (``argv[0]`` already resolved).
            cwd: Working directory.
            env: The complete environment.
            limits: ``(resource, soft, hard)`` rlimits applied before the program runs.
            stdin: Give the child a stdin pipe (else /dev/null).
            stdout: Give the child a stdout pipe (else /dev/null).
            stderr: Give the child a stderr pipe (else /dev/null).
            may_fork: The sidecar allows forking from the host's zygote (``spawn: auto``); when
                there is one and the worker qualifies it is forked there, else exec'd with one
                log line saying why (:mod:`supervisor.processes.zygote`).
            confine: The sidecar's walls (PROTOCOL 7), with a private ``TMPDIR``: put up by
                the zygote's child when there is a zygote to take the start, else by the exec
                shim (``processes.confine_spawn``).

        Raises:
            OSError: The program could not be executed (the message names it).
        """
        if confine is not None and confine.plan.active:
            return self._confined(
                argv, cwd, env, limits, (stdin, stdout, stderr), may_fork, confine
            )
        z = self.zygote
        if may_fork and z is not None and stdin and stdout and stderr:
            child, why = z.fork(argv, cwd=cwd, env=env, limits=limits)
            if child is not None:
                return child
            z.fell_back(why)
        return exec_child(
            argv,
            cwd=cwd,
            env=env,
            limits=limits,
            stdin=stdin,
            stdout=stdout,
            stderr=stderr,
            warden=self.warden,
        )

    def _confined(
        self,
        argv: Sequence[str],
        cwd: str,
        env: Mapping[str, str],
        limits: Sequence[tuple[int, int, int]],
        stdio: tuple[bool, bool, bool],
        may_fork: bool,
        confine: SidecarConfinement,
    ) -> Child:
        _check_program(argv, cwd, env)
        z = self.zygote
        limit = confine.spare_limit
        group = None
        if z is not None and limit and confine.cgroups is not None:
            group = z.take_spare(confine.cgroups, limit)
        prepared = confine.prepare(argv, cgroup=group, cwd=cwd, env=env, host_join=z is None)
        full_env = {**env, **prepared.env}
        stdin, stdout, stderr = stdio
        if z is not None:
            try:
                child, why = z.fork(
                    argv,
                    cwd=cwd,
                    env=full_env,
                    limits=limits,
                    walls=prepared,
                    run=may_fork,
                    stdin=stdin,
                    stdout=stdout,
                    stderr=stderr,
                )
            except BaseException:
                prepared.finish()
                raise
            if may_fork and (child is None or child.started_by != "zygote"):
                z.fell_back(why)
            if child is not None:
                prepared.via = "zygote"
                prepared.started()
                child.confinement = prepared
                return child
            # The zygote may have got the request and answered late: its worker (killed as a
            # late answer) may hold this worker's parts. The shim gets fresh ones.
            prepared.finish()
            prepared = confine.prepare(argv, cwd=cwd, env=env, host_join=True)
            full_env = {**env, **prepared.env}
        try:
            child = exec_child(
                prepared.argv,
                cwd=cwd,
                env=full_env,
                limits=limits,
                stdin=stdin,
                stdout=stdout,
                stderr=stderr,
                warden=self.warden,
                pass_fds=prepared.pass_fds,
            )
        except BaseException:
            prepared.finish()
            raise
        join = prepared.host_join(child.pid)
        if join is not None:  # off this thread, while the shim's interpreter starts
            try:
                trio.lowlevel.start_thread_soon(join, _joined)
            except RuntimeError:  # no thread to be had: here, one migration's wait
                join()
        prepared.via = "shim"
        prepared.started()
        child.confinement = prepared
        return child


def _joined(_outcome: object) -> None:
    """``Prepared.host_join`` never raises and its word went to the child: nothing to do."""


def _check_program(argv: Sequence[str], cwd: str, env: Mapping[str, str]) -> None:
    """Raise what ``exec`` of ``argv`` would, before the shim starts: an unconfined start
    reports a missing or non-executable program as the spawn's own ``OSError`` (the worker is
    ``start-failed``, its tools unavailable), and a confined one must too, not as a child that
    ran and exited 126 (the shim still reports a program gone in between that way).

    Raises:
        FileNotFoundError: No such program (on the child's ``PATH`` for a bare name).
        PermissionError: It is not executable.
    """
    program = argv[0] if argv else ""
    if not program:
        raise FileNotFoundError(errno.ENOENT, "no program", program)
    if "/" in program:
        path = os.path.join(cwd, program)
        if not os.path.exists(path):
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), program)
        if os.path.isdir(path) or not os.access(path, os.X_OK):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), program)
        return
    search = env.get("PATH", os.defpath)
    if any(not os.path.isabs(d) for d in search.split(os.pathsep)):
        return  # relative entries are the child's cwd's: the shim reports it
    if shutil.which(program, path=search) is None:
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), program)
