"""One confined worker start: what the spawn path adds to an exec for a sidecar's walls.

# Strategy: the host holds one :class:`SidecarConfinement` per sidecar (its
# :class:`~supervisor.processes.confine.SidecarWalls`, made at registry load, and the host's
# pids groups) and hands it down in the launch spec. :meth:`SidecarConfinement.prepare` makes
# one worker's parts in the parent: its private ``TMPDIR``, its pids group, the walls written to
# a ``memfd`` (the shim reads it to EOF; no pipe buffer to fill), the report channel (a
# socketpair), and the shim's command line (``confine.shim_argv``). The spawner hands them to
# the host's zygote when it runs one (the memfd and the descriptors the walls name go by
# ``SCM_RIGHTS``; its child puts the walls up, then runs the Python worker or execs the program:
# no interpreter start), else to the exec shim (``TOOLHOST_SPAWN=exec``, not Linux, a zygote
# that is down or slow), which costs one bare interpreter start; there the host itself moves the
# child into its pids group (:meth:`Prepared.host_join`, in a thread: a cgroup v1 migration
# waits for an RCU grace period) while the shim's interpreter starts, and the shim waits for
# its word before anything of the worker runs. :class:`Prepared` closes the
# child's descriptors once the child runs, reads the report, and removes the ``TMPDIR`` and the
# group when the worker ends (:meth:`Prepared.finish`).
"""

from __future__ import annotations

import contextlib
import errno
import os
import socket
from collections.abc import Callable, Mapping, Sequence

from supervisor.contracts.confine import ConfinementFacts, ConfinePlan
from supervisor.processes import confine, confine_direct, limits, unix_gate
from supervisor.processes.pids_cgroup import KeptGroups, PidsCgroups
from supervisor.processes.walls import Walls, read_report

WorkerEnv = Callable[[str], tuple[dict[str, str], Callable[[], None]]]
"""``worker key -> (variables for that worker alone, what undoes them when it ends)``."""
Gate = Callable[[socket.socket, "Prepared", unix_gate.Rules], "Callable[[], None] | None"]
"""The host's Unix socket gate: ``UnixGate.watch``."""
GateWatch = Callable[[socket.socket, "Prepared"], "Callable[[], None] | None"]
"""``(report channel, worker) -> stop waiting for its report`` (None: no gate runs): the host's
Unix socket gate (``host/unix_gate.py``), bound to the worker's rules."""


class Prepared:
    """One worker's confinement, made in the parent before the start."""

    __slots__ = (
        "_cgroup",
        "_channel",
        "_child_fds",
        "_facts",
        "_gate",
        "_gate_stop",
        "_kept",
        "_report",
        "_word_fd",
        "argv",
        "by_host",
        "env",
        "inherited",
        "pass_fds",
        "plan",
        "program",
        "release",
        "via",
        "walls_fd",
        "why_exec",
    )

    def __init__(
        self,
        plan: ConfinePlan,
        argv: list[str],
        env: dict[str, str],
        pass_fds: list[int],
        child_fds: list[int],
        channel: socket.socket | None,
        tmpdir: str,
        cgroup: str,
        *,
        program: list[str],
        walls_fd: int,
        inherited: list[int],
        kept: KeptGroups | None = None,
    ) -> None:
        self.plan = plan
        self.program = program
        """The sidecar's command line."""
        self.argv = argv
        """The shim's command line (it execs the sidecar's, or runs it: :attr:`why_exec`)."""
        self.walls_fd = walls_fd
        """The memfd holding the walls (``Walls.dumps``)."""
        self.inherited = inherited
        """The descriptors the walls name (the zygote's request carries them after the memfd)."""
        self.via = ""
        """Who put the walls up: ``zygote`` or ``shim`` (set by the spawner)."""
        self.why_exec = ""
        """Why :attr:`argv` is the shim exec'ing the program ("": the shim's ``--python`` form,
        the worker's own interpreter puts the walls up and runs it)."""
        self.by_host = False
        """The walls say the host moves the child into its pids group (:meth:`host_join`)."""
        self._word_fd = -1
        self.env = env
        """What the worker's environment gets: ``TMPDIR`` (and the proxy's variables)."""
        self.pass_fds = pass_fds
        self._child_fds = child_fds
        self._channel = channel
        self._cgroup = cgroup
        self._kept = kept if plan.keep != "worker" else None
        self._report: dict[str, object] | None = None
        self._facts: ConfinementFacts | None = None
        self.release: Callable[[], None] | None = None
        """Undoes what was issued for this worker alone (its proxy token), at :meth:`finish`."""
        self._gate: GateWatch | None = None
        self._gate_stop: Callable[[], None] | None = None
        self.env.setdefault("TMPDIR", tmpdir)

    @property
    def cgroup(self) -> str:
        """The worker's pids group folder (``""``: none)."""
        return self._cgroup

    def host_join(self, pid: int) -> Callable[[], None] | None:
        """What moves the child ``pid`` into this worker's pids group and then tells it so on
        the report channel (``ok``, or ``no ERRNO WHY``): the exec shim waits for that word,
        and checks ``/proc/self/cgroup``, before it puts the other walls up and runs anything
        of the worker. Call it once, right after the spawn (until its result ran, the shim
        waits); the result blocks (a cgroup v1 migration waits for an RCU grace period: ~15-40
        ms) and never raises: run it in a thread. None: the child joins by itself
        (:attr:`by_host` is false), or it was called before."""
        word_fd, self._word_fd = self._word_fd, -1
        if word_fd < 0:
            return None
        procs = PidsCgroups.procs_file(self._cgroup)

        def join() -> None:
            try:
                try:
                    fd = os.open(procs, os.O_WRONLY | os.O_CLOEXEC)
                    try:
                        os.write(fd, b"%d" % pid)
                    finally:
                        os.close(fd)
                    word = b"ok"
                except OSError as exc:
                    why = exc.strerror or str(exc)
                    word = b"no %d %s" % (exc.errno or errno.EIO, why.encode(errors="replace"))
                with contextlib.suppress(OSError):  # a child gone meanwhile needs no word
                    os.write(word_fd, word)
            finally:
                os.close(word_fd)

        return join

    def started(self) -> None:
        """The child runs (or never will): close the descriptors only it needed; a gated
        worker's report channel goes to the host's Unix socket gate (it brings the gate's
        descriptor with the report)."""
        for fd in self._child_fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self._child_fds = []
        gate, self._gate = self._gate, None
        if gate is not None and self._channel is not None:
            self._gate_stop = gate(self._channel, self)
            if self._gate_stop is not None:
                self._channel = None

    def reported(self, report: dict[str, object]) -> None:
        """The report, read by the gate from the channel it took over."""
        self._report = report

    def report(self) -> dict[str, object] | None:
        """What the child's walls reported (None: nothing came yet)."""
        if self._report is None and self._channel is not None:
            try:
                data = self._channel.recv(65536, socket.MSG_DONTWAIT)
            except (BlockingIOError, OSError):
                return None
            with contextlib.suppress(ValueError):
                self._report = read_report(data)
            self._channel.close()
            self._channel = None
        return self._report

    def facts(self, pid: int) -> ConfinementFacts:
        """``stability.details.confinement`` of the running worker ``pid`` (read from
        ``/proc`` once its report came; kept from then on: walls never come down)."""
        if self._facts is not None:
            return self._facts
        facts = confine.facts(self.plan, pid, self.report())
        if self._report is not None:
            self._facts = facts
        return facts

    def finish(self, *, ended: bool = False) -> None:
        """Remove the worker's ``TMPDIR`` and its pids group, killing what is left in it;
        ``ended`` (the worker ran and was reaped) with ``confine.keep``: moving that to the
        sidecar's kept group instead (a start abandoned midway keeps nothing). What was issued
        to it alone (:attr:`release`: its proxy token) is undone now, or, when processes of it
        were kept, when the kept group goes (``KeptGroups.hold``)."""
        self._gate = None  # never started: nothing to gate
        stop, self._gate_stop = self._gate_stop, None
        if stop is not None:  # a report that never came is not waited for any longer
            stop()
        self.started()
        if self._channel is not None:
            self._channel.close()
            self._channel = None
        if self._word_fd >= 0:  # never spawned: no join to tell of
            with contextlib.suppress(OSError):
                os.close(self._word_fd)
            self._word_fd = -1
        tmpdir = self.env.get("TMPDIR", "")
        if tmpdir:
            confine.remove_tmpdir(tmpdir)
        kept = 0
        if self._cgroup:
            with contextlib.suppress(OSError):
                if self._kept is not None and ended:
                    plan = self.plan
                    kept = self._kept.keep(plan.sidecar, plan.keep, plan.processes, self._cgroup)
                else:
                    PidsCgroups.remove(self._cgroup)
            self._cgroup = ""
        release, self.release = self.release, None
        if release is not None and kept and self._kept is not None:
            self._kept.hold(self.plan.sidecar, release)  # what it kept still uses its token
        elif release is not None:
            release()


class SidecarConfinement:
    """What a spawner needs to confine one sidecar's workers (held by the host per plan).

    Args:
        plan: The sidecar's plan.
        walls: Its prepared walls (``confine.SidecarWalls``; None with ``refused``).
        cgroups: The host's pids groups (None: none here).
        kept: The host's kept groups (``confine.keep``; None: none here).
        proxy_env: The egress proxy's variables for this sidecar's workers (empty: none).
        refused: Why no worker may start (``confinement-unavailable`` under ``required``).
        worker_env: Variables issued to one worker alone (named by its key), with what undoes
            them when it ends: the shared proxy's URL with the worker's token (no namespace).
        gate: The host's Unix socket gate (``UnixGate.watch``): with it, and a kernel that
            can, a profile's ``unix`` grants are enforced path by path (None: they open
            every pathname socket, as Landlock alone leaves them).
    """

    def __init__(
        self,
        plan: ConfinePlan,
        walls: confine.SidecarWalls | None,
        cgroups: PidsCgroups | None = None,
        proxy_env: dict[str, str] | None = None,
        refused: str = "",
        worker_env: WorkerEnv | None = None,
        kept: KeptGroups | None = None,
        gate: Gate | None = None,
    ) -> None:
        self.plan = plan
        self.walls = walls
        self.cgroups = cgroups
        self.kept = kept
        self.proxy_env = dict(proxy_env or {})
        self.refused = refused
        self.worker_env = worker_env
        self.gate = gate if plan.unix and not unix_gate.available() else None
        self._count = 0

    @property
    def spare_limit(self) -> int:
        """``pids.max`` for a group the zygote's spare joined ahead (0: this sidecar's workers
        take none: refused, no pids groups, or a limit of 1, which leaves the spare no room to
        fork)."""
        plan = self.plan
        if self.walls is None or plan.pids != "cgroup" or self.cgroups is None:
            return 0
        return plan.processes if plan.processes >= 2 else 0

    def prepare(
        self,
        argv: Sequence[str],
        cgroup: str | None = None,
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        host_join: bool = False,
    ) -> Prepared:
        """One worker's parts: ``TMPDIR``, pids group, the walls (a memfd), the channel, and
        the shim's command line.

        Args:
            argv: The sidecar's command line.
            cgroup: A pids group made ahead, its ``pids.max`` already :attr:`spare_limit`
                (the zygote's spare's, ``Zygote.take_spare``); the worker owns it from now on
                (removed by :meth:`Prepared.finish`). None: a fresh one is made here.
            cwd: The worker's working directory and (``env``) its environment: with both, a
                Python worker of the host's interpreter may get the shim's ``--python`` form
                (one interpreter start: ``processes.confine_direct``); else the shim execs.
            host_join: The host moves the child into its pids group (the exec shim's start:
                :meth:`Prepared.host_join`); else the child joins it itself (the zygote's
                child, or any caller that does not start the join).

        Raises:
            OSError: A part could not be made.
        """
        plan = self.plan
        if self.walls is None:
            if cgroup:
                with contextlib.suppress(OSError):
                    PidsCgroups.remove(cgroup)
            raise PermissionError(errno.EACCES, self.refused or "confinement-unavailable")
        self._count += 1
        name = f"{plan.sidecar}-{os.getpid()}-{self._count}"
        safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in name)
        if cgroup is None and plan.pids == "cgroup" and self.cgroups is not None:
            cgroup = ""
            with contextlib.suppress(OSError):
                cgroup = self.cgroups.create(safe, plan.processes)
        try:
            return self._prepare(argv, cgroup or "", safe, cwd, env, host_join)
        except BaseException:
            if cgroup:  # the worker that would own it never exists
                with contextlib.suppress(OSError):
                    PidsCgroups.remove(cgroup)
            raise

    def _prepare(
        self,
        argv: Sequence[str],
        cgroup: str,
        key: str,
        cwd: str | None,
        env: Mapping[str, str] | None,
        host_join: bool = False,
    ) -> Prepared:
        plan = self.plan
        assert self.walls is not None
        nproc = limits.user_tasks() + plan.processes if plan.pids == "rlimit" else 0
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
        tmpdir = ""
        memfd = word_fd = -1
        try:  # until Prepared owns them, every part made here is undone here
            walls, tmpdir = self.walls.worker(
                cgroup=cgroup or None,
                nproc=nproc,
                channel=child.fileno(),
                gate=bool(self.gate),
                cgroup_by_host=host_join,
            )
            memfd = os.memfd_create("toolhost-walls", 0)
            view = memoryview(walls.dumps())
            while view:
                view = view[os.write(memfd, view) :]
            os.lseek(memfd, 0, os.SEEK_SET)
            inherited = self.walls.inherited(walls)
            if walls.cgroup_by_host:  # the host's word goes on it (the channel may go to the gate)
                word_fd = os.dup(parent.fileno())
            why = self._why_exec(argv, walls, cwd, env)
            if why:
                argv_shim = confine.shim_argv(argv, memfd)
            else:
                argv_shim = confine_direct.direct_argv(argv, memfd)
        except BaseException:
            parent.close()
            child.close()
            for fd in (memfd, word_fd):
                if fd >= 0:
                    with contextlib.suppress(OSError):
                        os.close(fd)
            if tmpdir:
                confine.remove_tmpdir(tmpdir)
            raise
        child_fd = child.detach()
        prepared = Prepared(
            plan,
            argv_shim,
            dict(self.proxy_env),
            sorted({*inherited, memfd}),
            [memfd, child_fd],
            parent,
            tmpdir,
            cgroup,
            program=list(argv),
            walls_fd=memfd,
            inherited=inherited,
            kept=self.kept,
        )
        prepared.why_exec = why
        prepared.by_host = walls.cgroup_by_host
        prepared._word_fd = word_fd
        gate = self.gate
        if gate is not None and walls.gate:
            ports = tuple(walls.tcp_connect) if walls.tcp_connect is not None else None
            rules = unix_gate.Rules(plan.unix, ports, plan.never)
            prepared._gate = lambda channel, worker: gate(channel, worker, rules)
        if self.worker_env is not None:
            try:
                mine, prepared.release = self.worker_env(key)
            except BaseException:
                prepared.finish()
                raise
            prepared.env.update(mine)
        return prepared

    def _why_exec(
        self,
        argv: Sequence[str],
        walls: Walls,
        cwd: str | None,
        env: Mapping[str, str] | None,
    ) -> str:
        """Why the shim must exec ``argv`` ("": its ``--python`` form runs it)."""
        if cwd is None or env is None or self.walls is None:
            return "no environment given"
        writable = [*walls.write, self.walls.tmp_root] if walls.landlock_abi > 0 else None
        full_env = {**env, **self.proxy_env}
        return confine_direct.problem(argv, cwd, full_env, writable) or ""

    def close(self) -> None:
        if self.walls is not None:
            self.walls.close()
