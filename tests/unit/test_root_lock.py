"""``lock_root``: one host per app root (``.toolhost/host.lock``, an ``flock``)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import pytest

from supervisor.cli.common import HOST_LOCK, RootTaken, lock_root


def test_a_second_holder_is_refused_naming_the_first_and_the_lock_goes_with_it(tmp_path):
    # The first host is another process, as in real use (flock is per open file).
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys; from supervisor.cli.common import lock_root; "
            f"lock = lock_root({str(tmp_path)!r}, ''); print('held', flush=True); "
            "sys.stdin.read()",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        with pytest.raises(RootTaken) as taken:
            lock_root(str(tmp_path), "Do something else")
        assert f"pid {holder.pid}" in str(taken.value)
        assert str(taken.value).endswith("Do something else")
    finally:
        holder.communicate("", timeout=10)
    lock = lock_root(str(tmp_path), "")  # the holder is gone: the kernel dropped its flock
    assert lock is not None and (tmp_path / HOST_LOCK).read_text() == f"{os.getpid()}\n"
    lock.release()


def test_a_root_where_no_lock_can_be_made_warns_and_goes_on(tmp_path, caplog):
    (tmp_path / ".toolhost").write_text("not a folder")
    with caplog.at_level(logging.WARNING, logger="toolhost"):
        assert lock_root(str(tmp_path), "") is None
    assert "would not be refused" in caplog.text


def test_the_lock_is_never_taken_through_a_symlink(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("keep")
    (tmp_path / ".toolhost").mkdir()
    (tmp_path / HOST_LOCK).symlink_to(victim)
    with pytest.raises(RootTaken, match="symlink"):
        lock_root(str(tmp_path), "")
    assert victim.read_text() == "keep"
