"""``catalog.changed`` says what left (PROTOCOL 6): a client that keeps a mirror of the catalog
from one ``capability.catalog.get`` plus the events never has to read the catalog again, through
registry edits, reloads and worker crashes in a random order."""

import contextlib
import os
import random
import signal

import msgspec
import trio

from supervisor.contracts.snapshot import StabilityDetails
from tests.conftest import (
    ECHO_TOOLS,
    echo,
    running_host,
    unix_client,
    wait_available,
    write_registry,
)

SIDECARS = ["a", "b", "c"]


async def assert_mirror_is_the_catalog(client, mirror):
    """Read the catalog until the mirror has caught up with the same revision; compare."""
    with trio.fail_after(20):
        while True:
            fresh = await client.catalog()
            await mirror.wait_revision(fresh.revision)
            if mirror.revision == fresh.revision:
                break  # else the catalog moved again meanwhile: read it again
    assert [d.name for d in mirror.descriptors()] == [d.name for d in fresh.tools]
    assert [without_details(d) for d in mirror.descriptors()] == [
        without_details(d) for d in fresh.tools
    ]


def without_details(d):
    """A change of ``stability.details`` alone (restart counts, last exit, the restart window)
    sends no event by design (kernel-protocol.md); everything else must match."""
    stability = msgspec.structs.replace(d.stability, details=StabilityDetails())
    return msgspec.structs.replace(d, stability=stability)


async def test_a_tool_that_leaves_is_named_in_removed(app):
    async with running_host(app, {"a": echo(tools=["echo.say", "echo.fail"])}) as host:
        await wait_available(host, "echo.say", "echo.fail")
        async with unix_client(host) as client:
            mirror = await client.mirror_catalog()
            assert "echo.fail" in mirror.tools
            write_registry(app, {"a": echo(tools=["echo.say"])})
            result = await client.request("registry.reload")
            assert result["applied"], result
            with trio.fail_after(20):
                while True:
                    msg = await client.events.receive()
                    data = msg["data"]
                    if data["removed"]:
                        break
            assert data["removed"] == ["echo.fail"]
            assert "echo.fail" not in {d["name"] for d in data["tools"]}
            await assert_mirror_is_the_catalog(client, mirror)
            assert "echo.fail" not in mirror.tools


def random_registry(rng: random.Random) -> dict:
    """Each echo tool served by at most one of the sidecars (or by none: it leaves)."""
    owners: dict[str, list[str]] = {sid: [] for sid in SIDECARS}
    for tool in ECHO_TOOLS:
        sid = rng.choice([*SIDECARS, None])
        if sid is not None:
            owners[sid].append(tool)
    reg = {}
    for sid, tools in owners.items():
        if tools:
            reg[sid] = echo(tools=tools, enabled=rng.random() > 0.15)
    return reg


async def test_the_mirror_equals_the_catalog_after_random_edits_reloads_and_crashes(app):
    seed = int(os.environ.get("TOOLHOST_MIRROR_SEED", "0")) or random.randrange(1, 1 << 30)
    rng = random.Random(seed)
    print(f"seed {seed} (TOOLHOST_MIRROR_SEED={seed} replays it)")
    write_registry(app, random_registry(rng))
    async with running_host(app) as host, unix_client(host) as client:
        mirror = await client.mirror_catalog()
        steps = []
        for _ in range(14):
            step = rng.choice(["edit", "edit", "reload", "crash", "crash", "restart"])
            steps.append(step)
            if step == "edit":
                write_registry(app, random_registry(rng))
                await client.request("registry.reload")
            elif step == "reload":
                await client.request("registry.reload")
            else:
                pools = [p for p in host.pools.values() if p.workers]
                if not pools:
                    continue
                pool = rng.choice(pools)
                if step == "crash":
                    pid = pool.workers[0].pid
                    if pid:
                        with contextlib.suppress(ProcessLookupError):  # it died already
                            os.kill(pid, signal.SIGKILL)
                else:
                    sid = next(s for s, p in host.pools.items() if p is pool)
                    await client.restart(sid, force=True)
            await trio.sleep(rng.choice([0, 0.05, 0.2]))
            await assert_mirror_is_the_catalog(client, mirror)
        await assert_mirror_is_the_catalog(client, mirror)
        assert mirror.revision > 1, steps
