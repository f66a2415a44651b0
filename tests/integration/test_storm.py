"""Twenty sidecars that crash at start cannot starve the healthy ones: worker starts share a
host-wide FIFO of spawn slots and restarts share a host-wide budget. Asserted through the order
and the counts of slot grants, never through wall-clock durations."""

import math

import trio

from supervisor.calls.call import InvokeRequest
from tests.conftest import FIXTURES, running_host, script, wait_available

CRASHERS = 20
HEALTHY = 3
SPAWNS = 4
RATE = 5.0
BURST = 3


def crasher(i):
    # No backoff and no intensity limit: without the host-wide budget this is a restart storm.
    restart = {"backoffMs": 0, "maxBackoffMs": 0, "intensity": 10_000, "periodMs": 60_000}
    return script("exit_at_once", [f"dead{i}.tool"], restart=restart)


def healthy(i):
    tool = f"ok{i}.tool"
    return script("anytool", [tool], args=[str(FIXTURES / "anytool.py"), tool])


async def test_crashing_sidecars_do_not_starve_healthy_ones(app):
    reg = {f"dead{i:02d}": crasher(i) for i in range(CRASHERS)}
    reg |= {f"ok{i}": healthy(i) for i in range(HEALTHY)}  # listed last: the worst case
    host_cfg = {
        "maxConcurrentSpawns": SPAWNS,
        "maxRestartsPerSecond": RATE,
        "restartBurst": BURST,
        "statsIntervalMs": 600_000,
    }
    t_start = trio.current_time()
    async with running_host(app, reg, host=host_cfg) as host:
        guard = host.usage.guard
        await wait_available(host, *(f"ok{i}.tool" for i in range(HEALTHY)), timeout=60)
        grants = list(guard.grants)
        healthy_ids = {f"ok{i}" for i in range(HEALTHY)}
        first = {sid: next(n for n, g in enumerate(grants) if g[0] == sid) for sid in healthy_ids}
        last_healthy = max(first.values())
        before = grants[:last_healthy]
        # Ordering: until every healthy sidecar had its first slot, no crasher started a third
        # time; the FIFO put the healthy first starts ahead of the crashers' later restarts.
        starts: dict[str, int] = {}
        for sid, _, _ in before:
            starts[sid] = starts.get(sid, 0) + 1
        assert max(n for sid, n in starts.items() if sid not in healthy_ids) <= 2, starts
        # Counts: restarts granted so far fit the budget (burst + rate x elapsed), so the
        # crashers took no more than their fair share of slots.
        t_last = grants[last_healthy][2]
        restarts_before = sum(1 for g in before if g[1])
        assert restarts_before <= BURST + math.ceil(RATE * (t_last - t_start)), restarts_before
        restarts = sum(1 for g in grants if g[1])
        assert restarts <= BURST + math.ceil(RATE * (trio.current_time() - t_start))
        assert sum(1 for g in grants if not g[1] and g[0] not in healthy_ids) == CRASHERS
        # There was a storm to contain: the budget made restarts wait.
        st = host.views.stats().host
        assert st.restartsDelayed > 0 and st.maxConcurrentSpawns == SPAWNS
        assert st.spawning <= SPAWNS
        for i in range(HEALTHY):
            assert (await host.invoker.invoke(InvokeRequest(f"ok{i}.tool"))).status == "success"
        d = host.catalog.get("dead0.tool")
        assert d.stability.runtime == "failed" and not d.visible
