"""``lock_root``: one host per app root (``.toolhost/host.lock``, an ``flock``)."""

from __future__ import annotations

import logging
import os

import pytest

from supervisor.cli.common import HOST_LOCK, RootTaken, lock_root
from tests.conftest import hold_host_lock


def test_a_second_holder_is_refused_naming_the_first_and_the_lock_goes_with_it(tmp_path):
    # The first host is another process, as in real use (flock is per open file).
    holder = hold_host_lock(tmp_path, "serve")
    try:
        with pytest.raises(RootTaken) as taken:
            lock_root(str(tmp_path), "Do something else", "embedded")
        assert f"pid {holder.pid}: `toolhost serve`)" in str(taken.value)  # named, and what
        assert (taken.value.holder, taken.value.role) == (str(holder.pid), "serve")
        assert str(taken.value).endswith("Do something else")
    finally:
        holder.communicate("", timeout=10)
    lock = lock_root(str(tmp_path), "", "embedded")  # the holder is gone: its flock went too
    assert lock is not None and (tmp_path / HOST_LOCK).read_text() == f"{os.getpid()} embedded\n"
    lock.release()


def test_a_root_where_no_lock_can_be_made_warns_and_goes_on(tmp_path, caplog):
    (tmp_path / ".toolhost").write_text("not a folder")
    with caplog.at_level(logging.WARNING, logger="toolhost"):
        assert lock_root(str(tmp_path), "", "serve") is None
    assert "would not be refused" in caplog.text


def test_the_lock_is_never_taken_through_a_symlink(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("keep")
    (tmp_path / ".toolhost").mkdir()
    (tmp_path / HOST_LOCK).symlink_to(victim)
    with pytest.raises(RootTaken, match="symlink"):
        lock_root(str(tmp_path), "", "serve")
    assert victim.read_text() == "keep"


def test_a_holder_from_before_roles_is_named_as_either_host(tmp_path):
    """A lock written by a version that wrote only its pid: the refusal names both hosts."""
    (tmp_path / ".toolhost").mkdir()
    holder = hold_host_lock(tmp_path, legacy=True)
    try:
        with pytest.raises(RootTaken) as taken:
            lock_root(str(tmp_path), "", "serve")
        assert f"pid {holder.pid}: `toolhost serve` or `toolhost mcp --embedded`" in str(
            taken.value
        )
        assert (taken.value.holder, taken.value.role) == (str(holder.pid), "")
    finally:
        holder.communicate("", timeout=10)
