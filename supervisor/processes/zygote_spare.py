"""The zygote's spare, the host's side: a pids group joined ahead of the next confined start.

# Strategy (docs/confinement.md, "Costs"): on cgroup v1 a worker that writes its pid into its
# own new pids group waits for an RCU grace period (the migration takes the kernel's threadgroup
# lock for writing): ~15 ms per start, on the critical path. So the host makes the *next*
# worker's group ahead (``pids.max`` 1, empty) and asks the zygote for a spare in it
# (``{"spare": n, "procs": ...}``); the spare, a fresh fork of the zygote, joins the group while
# nothing waits for it and reports ``{"spare": n, "pid": ...}``. A confined start then takes
# the group (:meth:`Spare.take`: ``pids.max`` becomes the plan's limit, the worker's ``Prepared``
# owns the group from then on) and its fork request names the spare; the spare forks the
# worker inside the group (a fork keeps the group) and exits. Right after a take the zygote's
# task asks for the next spare. A spare that is not taken is removed with its group when the
# zygote stops (:meth:`Spare.discard`); one whose join failed turns spares off for this host
# (every start then joins its own fresh group, as before). One group per worker still bounds a
# fork bomb, and the host still removes every group.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

import trio

from supervisor.processes.pids_cgroup import PidsCgroups

log = logging.getLogger("toolhost.zygote")


class Spare:
    """The zygote's spare as the host knows it: its group, its number, whether it joined."""

    def __init__(self) -> None:
        self.cgroups: PidsCgroups | None = None
        """Where spare groups are made (the first confined start's; None: no spare yet)."""
        self.made: tuple[int, str] | None = None
        """``(n, group)`` of the spare the zygote was asked for and no start took yet."""
        self.pid: int | None = None
        """The spare's pid, once it reported that it is in its group."""
        self.off = ""
        """Why no more spares are made ("": they are)."""
        self.wanted = trio.Event()
        """Set when the zygote should be asked for a spare (the zygote's task waits for it)."""
        self.joined = trio.Event()
        """Set when the current spare reported that it is in its group."""
        self._taken: tuple[int, str] | None = None
        self._n = 0

    def take(self, cgroups: PidsCgroups, limit: int) -> str | None:
        """A confined start's pids group, joined ahead by the spare, with ``pids.max`` =
        ``limit`` (None: no spare now; make a fresh group). Asks for the next spare either way.
        The caller owns the group from now on and must name it in the walls of the very next
        fork request (:meth:`claim`)."""
        if self.cgroups is not cgroups:
            self.discard()
            self.cgroups = cgroups
        self.wanted.set()
        made, self.made = self.made, None
        self.pid, self.joined = None, trio.Event()
        if made is None:
            return None
        try:
            PidsCgroups.set_limit(made[1], limit)
        except OSError:
            with contextlib.suppress(OSError):
                PidsCgroups.remove(made[1])
            return None
        self._taken = made
        return made[1]

    def claim(self, group: str) -> int | None:
        """The spare to name in a fork request whose worker's group is ``group`` (None: none).
        Called once per fork request: a group taken and not claimed by the next request is no
        longer the spare's to serve."""
        taken, self._taken = self._taken, None
        return taken[0] if taken is not None and group and taken[1] == group else None

    def request(self) -> dict[str, Any] | None:
        """Make the next spare's group (empty, ``pids.max`` 1); the message that asks the
        zygote for the spare (None: none is wanted, or spares are off)."""
        self.wanted = trio.Event()
        if self.cgroups is None or self.off or self.made is not None:
            return None
        self._n += 1
        try:
            path = self.cgroups.create(f"spare-{self._n}", 1)
        except OSError as exc:
            self.turn_off(f"cannot make a spare pids group: {exc}")
            return None
        self.made = (self._n, path)
        return {"spare": self._n, "procs": PidsCgroups.procs_file(path)}

    def report(self, msg: dict[str, Any]) -> None:
        """The spare's own message: ``{"spare": n, "pid": p}`` (in its group) or ``{"spare": n,
        "error": why}`` (it could not join: it exited)."""
        if self.made is None or msg.get("spare") != self.made[0]:
            return
        pid = msg.get("pid")
        if isinstance(pid, int):
            self.pid = pid
            self.joined.set()
            return
        self.turn_off(f"the spare could not join its pids group: {msg.get('error')}")

    def turn_off(self, why: str) -> None:
        """No more spares for this host (every confined start joins a fresh group itself)."""
        if not self.off:
            log.info("zygote: %s; confined workers join their pids group themselves", why)
        self.off = why
        self.discard()

    def discard(self) -> None:
        """Remove the untaken spare's group (killing the spare in it): the zygote stops, or
        spares are off. A taken group belongs to its worker."""
        made, self.made = self.made, None
        self._taken = None
        self.pid = None
        if made is not None:
            with contextlib.suppress(OSError):
                PidsCgroups.remove(made[1])
