"""How a worker process starts: forked from the host's zygote when the sidecar allows it and the
zygote can, else exec'd. The one place that knows both ways, above them, so neither
``process`` nor ``zygote`` imports the other's caller (no import circle).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from supervisor.processes import zygote as zyg
from supervisor.processes.child import ChildProcess, exec_child


def spawn(
    argv: Sequence[str],
    *,
    cwd: str,
    env: Mapping[str, str],
    limits: Sequence[tuple[int, int, int]] = (),
    stdin: bool = True,
    stdout: bool = True,
    stderr: bool = True,
    zygote: bool = False,
) -> ChildProcess:
    """Start ``argv`` in its own session with pipes; it never outlives the host.

    Args:
        argv: Program and arguments (``argv[0]`` already resolved).
        cwd: Working directory.
        env: The complete environment.
        limits: ``(resource, soft, hard)`` rlimits applied before the program runs.
        stdin: Give the child a stdin pipe (else /dev/null).
        stdout: Give the child a stdout pipe (else /dev/null).
        stderr: Give the child a stderr pipe (else /dev/null).
        zygote: The sidecar allows forking from the host's zygote (``spawn: auto``); when the
            zygote is available and the worker qualifies it is forked there, else exec'd with
            one log line saying why (:mod:`supervisor.processes.zygote`).

    Raises:
        OSError: The program could not be executed (the message names it).
    """
    if zygote and stdin and stdout and stderr:
        z = zyg.active()
        if z is not None:
            child, why = z.fork(argv, cwd=cwd, env=env, limits=limits)
            if child is not None:
                return child
            z.fell_back(why)
    return exec_child(
        argv, cwd=cwd, env=env, limits=limits, stdin=stdin, stdout=stdout, stderr=stderr
    )
