"""One confined start's parts (``SidecarConfinement.prepare``): a step that fails midway leaves
nothing behind, neither the report channel's socketpair nor the worker's private ``TMPDIR``
(each failure made by the kernel: a folder gone, a descriptor table full)."""

from __future__ import annotations

import os
import resource
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import msgspec
import pytest

from supervisor.contracts.confine import Profile
from supervisor.processes.confine import SidecarWalls
from supervisor.processes.confine_spawn import SidecarConfinement
from supervisor.processes.pids_cgroup import PidsCgroups
from tests.integration.confine_kit import HOSTILE, KERNEL, World, make_world


@pytest.fixture
def world(tmp_path: Path) -> World:
    return make_world(tmp_path)


@contextmanager
def confinement(world: World) -> Iterator[SidecarConfinement]:
    plan = world.plan(Profile())
    assert plan.active, plan
    confine = SidecarConfinement(plan, SidecarWalls(plan, tmp_root=str(world.root)))
    try:
        yield confine
    finally:
        confine.close()


def open_fds() -> set[int]:
    """This process's descriptors (not the one that listed them, closed by now)."""
    fds = set()
    for name in os.listdir("/proc/self/fd"):
        try:
            os.fstat(int(name))
        except OSError:
            continue
        fds.add(int(name))
    return fds


def worker_tmpdirs(confine: SidecarConfinement) -> list[str]:
    assert confine.walls is not None
    root = confine.walls.tmp_root
    return sorted(os.listdir(root)) if os.path.isdir(root) else []


@contextmanager
def room_for(count: int, taken: set[int]) -> Iterator[None]:
    """A descriptor limit that leaves exactly ``count`` free numbers besides ``taken``."""
    limit, free = 0, 0
    while free < count:
        if limit not in taken:
            free += 1
        limit += 1
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_tmpdir_that_cannot_be_made_leaks_no_socketpair(world: World) -> None:
    with confinement(world) as confine:
        assert confine.walls is not None
        os.rmdir(confine.walls.tmp_root)  # the worker's TMPDIR is made below it
        before = open_fds()
        with pytest.raises(FileNotFoundError) as failed:
            confine.prepare([str(HOSTILE)])
        # Held, as a caller that logs it holds it: nothing waits for the collector to close.
        assert failed.value.filename is not None
        assert open_fds() == before


def test_a_full_descriptor_table_leaks_neither_socketpair_nor_tmpdir(world: World) -> None:
    with confinement(world) as confine:
        confine.prepare([str(HOSTILE)]).finish()  # everything imported, nothing left
        assert worker_tmpdirs(confine) == []
        before = open_fds()
        # Room for exactly two more descriptors: the socketpair gets them, the walls' memfd
        # after it fails with EMFILE.
        with room_for(2, before), pytest.raises(OSError) as failed:
            confine.prepare([str(HOSTILE)])
        assert failed.value.errno == 24, failed.value  # EMFILE, from memfd_create
        assert open_fds() == before
        assert worker_tmpdirs(confine) == []


@contextmanager
def host_joined(world: World) -> Iterator[SidecarConfinement]:
    """A plan with a pids group per worker, made in a plain folder (any user; nothing here
    is joined, nor removed: ``pids.max`` is a plain file there): its workers' walls say the
    host joins them (``prepare(host_join=True)``)."""
    plan = world.plan(Profile(), kernel=msgspec.structs.replace(KERNEL, pids_cgroup=True))
    assert plan.active and plan.pids == "cgroup", plan
    groups = PidsCgroups(str(world.root / "groups"), 1)
    confine = SidecarConfinement(plan, SidecarWalls(plan, tmp_root=str(world.root)), groups)
    try:
        yield confine
    finally:
        confine.close()


def test_a_host_joined_start_abandoned_before_its_spawn_leaves_no_descriptor(
    world: World,
) -> None:
    """The host's word goes on a descriptor of its own (the channel may go to the Unix socket
    gate meanwhile): made with the parts, closed with them when nothing was spawned."""
    with host_joined(world) as confine:
        confine.prepare([str(HOSTILE)], host_join=True).finish()  # everything imported
        before = open_fds()
        prepared = confine.prepare([str(HOSTILE)], host_join=True)
        assert prepared.by_host and len(open_fds() - before) == 4  # channel, memfd, the word's
        prepared.finish()
        assert open_fds() == before
        assert prepared.host_join(os.getpid()) is None  # nothing left to join with


def test_a_full_descriptor_table_at_the_hosts_word_leaks_nothing(world: World) -> None:
    with host_joined(world) as confine:
        confine.prepare([str(HOSTILE)], host_join=True).finish()
        before = open_fds()
        # Room for the socketpair and the memfd: the word's dup fails.
        with room_for(3, before), pytest.raises(OSError) as failed:
            confine.prepare([str(HOSTILE)], host_join=True)
        assert failed.value.errno == 24, failed.value  # EMFILE, from the dup
        assert open_fds() == before
        assert worker_tmpdirs(confine) == []
