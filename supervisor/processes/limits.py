"""Resource limits of worker processes, from the registry entry (docs/quotas-and-limits.md).

# Strategy: :func:`rlimits` is a pure function of the sidecar's entry, the host's own limits and
# (for ``nproc``) how many tasks the user runs now; the result is the ``(resource, soft, hard)``
# list that :meth:`supervisor.processes.spawn.Spawner.spawn` applies between fork and exec.
# Nothing is raised above the host's own hard limit (an unprivileged host could not, and a
# privileged one should not). ``RLIMIT_CORE`` is always 0: a crashing sidecar must not fill the
# disk with cores.
#
# ``RLIMIT_CPU`` counts a process's whole life, so it means two things here: for a per-call
# process (oneshot, simple-json) it is ``cpuSecondsPerCall`` itself, exact to the second; for a
# long-lived worker it is the optional lifetime budget ``limits.cpuSeconds``, and
# ``cpuSecondsPerCall`` is enforced per call by the accounting sampler instead.
"""

from __future__ import annotations

import math
import os
import resource
from collections.abc import Mapping

from supervisor.contracts.registry import SidecarConfig

RLimit = tuple[int, int, int]
NPROC_HEADROOM = 64
"""Tasks (processes and threads) added to ``limits.nproc`` for the worker's own threads and for
other processes of the same user that start meanwhile (RLIMIT_NPROC counts all of them)."""
CPU_KILL_GRACE_S = 2
"""Seconds between SIGXCPU (soft limit) and SIGKILL (hard limit)."""
MIN_LINE = 2 * (4 << 20) + (64 << 10)
"""The floor of a worker's line limit: what the former 4 MiB ``maxOutputBytes`` default gave.
Lowering that default to 64 KiB (a model's context) must not turn answers of 1 to 8 MiB from
cut into failed, nor refuse host-service requests that carry a state value at its 1 MiB limit."""
MAX_LINE = 16 << 20

INFINITY = resource.RLIM_INFINITY
MANAGED = (
    resource.RLIMIT_CORE,
    resource.RLIMIT_AS,
    resource.RLIMIT_NOFILE,
    resource.RLIMIT_NPROC,
    resource.RLIMIT_CPU,
)


def host_limits() -> dict[int, tuple[int, int]]:
    """The host process's own ``(soft, hard)`` for every resource toolhost manages."""
    return {which: resource.getrlimit(which) for which in MANAGED}


def _cap(value: int, hard: int) -> int:
    return value if hard == INFINITY else min(value, hard)


def per_call_cpu_seconds(cfg: SidecarConfig) -> float:
    """The CPU seconds a per-call process may use: the largest value any of its tools may use,
    or 0 (no RLIMIT_CPU) when the sidecar sets none."""
    base = cfg.quota.cpu_seconds_per_call
    if base <= 0:
        return 0.0
    return max([base, *(t.cpu_seconds_per_call for t in cfg.quota.tools.values())])


def rlimits(
    cfg: SidecarConfig,
    *,
    per_call: bool,
    host: Mapping[int, tuple[int, int]],
    user_tasks: int | None = None,
) -> list[RLimit]:
    """The rlimits of one worker process (or of each per-call process).

    Args:
        cfg: The sidecar's registry entry.
        per_call: True for protocols that spawn one process per call.
        host: The host's own limits (:func:`host_limits`).
        user_tasks: Tasks the user runs now (needed only when ``limits.nproc`` is set).

    Returns:
        ``(resource, soft, hard)`` triples, ``RLIMIT_CORE`` first.
    """
    lim = cfg.limits
    out: list[RLimit] = [(resource.RLIMIT_CORE, 0, 0)]
    if lim.memory_mb:
        hard = host.get(resource.RLIMIT_AS, (INFINITY, INFINITY))[1]
        value = _cap(lim.memory_mb * 1024 * 1024, hard)
        out.append((resource.RLIMIT_AS, value, value))
    if lim.nofile:
        hard = host.get(resource.RLIMIT_NOFILE, (INFINITY, INFINITY))[1]
        value = _cap(lim.nofile, hard)
        out.append((resource.RLIMIT_NOFILE, value, value))
    if lim.nproc and user_tasks is not None:
        hard = host.get(resource.RLIMIT_NPROC, (INFINITY, INFINITY))[1]
        value = _cap(user_tasks + lim.nproc + NPROC_HEADROOM, hard)
        out.append((resource.RLIMIT_NPROC, value, value))
    cpu = math.ceil(per_call_cpu_seconds(cfg)) if per_call else lim.cpu_seconds
    if cpu:
        hard = host.get(resource.RLIMIT_CPU, (INFINITY, INFINITY))[1]
        out.append((resource.RLIMIT_CPU, _cap(cpu, hard), _cap(cpu + CPU_KILL_GRACE_S, hard)))
    return out


def for_worker(cfg: SidecarConfig, *, per_call: bool) -> list[RLimit]:
    """:func:`rlimits` with this host's limits and (for ``limits.nproc``) the user's tasks now."""
    tasks = user_tasks() if cfg.limits.nproc else None
    return rlimits(cfg, per_call=per_call, host=host_limits(), user_tasks=tasks)


def cpu_limit_of(limits: list[RLimit]) -> int | None:
    """The soft ``RLIMIT_CPU`` in a limits list (None when not set)."""
    for which, soft, _ in limits:
        if which == resource.RLIMIT_CPU:
            return soft
    return None


def output_limit(
    cfg: SidecarConfig, tool: str | None = None, result_limit: int | None = None
) -> int:
    """The ``maxOutputBytes`` that applies to a call of ``tool``: the smallest of the sidecar's
    ``maxOutputBytes``, its ``quota.maxOutputBytes`` (or the tool's own quota value, which
    replaces it) and the manifest's ``resultLimit``."""
    limit = cfg.max_output_bytes
    quota = cfg.quota.max_output_bytes
    if tool is not None:
        own = cfg.quota.tools.get(tool)
        if own is not None and own.max_output_bytes:
            quota = own.max_output_bytes
    if quota:
        limit = min(limit, quota)
    if result_limit:
        limit = min(limit, result_limit)
    return limit


def line_limit(cfg: SidecarConfig) -> int:
    """The longest protocol line (or per-call stdout) read from a worker of ``cfg``.

    Twice the largest output any of its tools may return plus 64 KiB of envelope, between 1 and
    16 MiB: output over ``maxOutputBytes`` but under this is cut (``meta.truncated``); over it,
    the read stops, the call fails ``output-too-large`` and the worker is replaced. Host memory
    per worker stays bounded by this figure.
    """
    largest = max(
        [output_limit(cfg), *(output_limit(cfg, t) for t in cfg.quota.tools)],
    )
    return max(MIN_LINE, min(MAX_LINE, 2 * largest + 64 * 1024))


def user_tasks(uid: int | None = None) -> int:
    """Tasks (processes and threads) of ``uid`` now, as ``RLIMIT_NPROC`` counts them."""
    uid = os.getuid() if uid is None else uid
    total = 0
    try:
        names = os.listdir("/proc")
    except OSError:
        return 0
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/status", "rb") as f:
                fields = dict(line.split(b":", 1) for line in f.read().splitlines() if b":" in line)
        except OSError:
            continue
        try:
            if int(fields[b"Uid"].split()[0]) == uid:
                total += int(fields[b"Threads"].strip())
        except (KeyError, ValueError, IndexError):
            continue
    return total
