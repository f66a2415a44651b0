"""One confined start's parts (``SidecarConfinement.prepare``): a step that fails midway leaves
nothing behind, neither the report channel's socketpair nor the worker's private ``TMPDIR``
(each failure made by the kernel: a folder gone, a descriptor table full)."""

from __future__ import annotations

import os
import resource
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from supervisor.contracts.confine import Profile
from supervisor.processes.confine import SidecarWalls
from supervisor.processes.confine_spawn import SidecarConfinement
from tests.integration.confine_kit import HOSTILE, World, make_world


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
        limit, free = 0, 0
        while free < 2:
            if limit not in before:
                free += 1
            limit += 1
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, hard))
        try:
            with pytest.raises(OSError) as failed:
                confine.prepare([str(HOSTILE)])
        finally:
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        assert failed.value.errno == 24, failed.value  # EMFILE, from memfd_create
        assert open_fds() == before
        assert worker_tmpdirs(confine) == []
