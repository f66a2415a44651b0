"""``processes.peers.PeerGuard``: which socket peers are this host's confined sidecar processes
(the kernel socket refuses them, PROTOCOL 7), judged on real processes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from supervisor.processes.peers import PeerGuard

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux /proc")

NNP = """
import ctypes, sys
libc = ctypes.CDLL(None, use_errno=True)
assert libc.prctl(38, 1, 0, 0, 0) == 0  # PR_SET_NO_NEW_PRIVS
print("ready", flush=True)
sys.stdin.read()
"""
PLAIN = 'import sys\nprint("ready", flush=True)\nsys.stdin.read()\n'


def start(code: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc


def stop(proc: subprocess.Popen[str]) -> None:
    assert proc.stdin is not None
    proc.stdin.close()
    proc.wait(10)


def test_the_host_itself_and_unknown_peers_are_never_refused() -> None:
    guard = PeerGuard()
    assert guard.refusal(os.getpid()) == ""
    assert guard.refusal(0) == ""
    assert guard.refusal(-1) == ""


def test_a_plain_child_is_welcome_and_a_walled_one_is_refused() -> None:
    own = Path("/proc/self/status").read_text()
    if "NoNewPrivs:\t1" in own:
        pytest.skip("this test runs with no_new_privs already: a child cannot add it")
    guard = PeerGuard()
    plain, walled = start(PLAIN), start(NNP)
    try:
        assert guard.refusal(plain.pid) == ""
        why = guard.refusal(walled.pid)
        assert "no_new_privs" in why and str(walled.pid) in why
    finally:
        stop(plain)
        stop(walled)


def test_walls_do_not_matter_for_processes_that_are_not_the_hosts_descendants() -> None:
    """A kernel run under systemd's ``NoNewPrivileges=`` must stay welcome: judge the walled
    child as if another process (its parent's parent) were the host."""
    walled = start(NNP)
    try:
        assert PeerGuard(host_pid=os.getppid()).refusal(walled.pid) != ""  # descends from it
        assert PeerGuard(host_pid=walled.pid + 10**6).refusal(walled.pid) == ""
    finally:
        stop(walled)


def test_a_process_in_a_worker_pids_group_is_refused_whoever_its_parent() -> None:
    walled = start(PLAIN)
    try:
        with open(f"/proc/{walled.pid}/cgroup") as f:
            parts = [p for line in f for p in line.strip().split(":", 2)[-1].split("/") if p]
        if parts:  # (at the root of every hierarchy there is no group to name)
            tag = parts[-1]
            assert "pids group" in PeerGuard(host_pid=1, cgroup_tag=tag).refusal(walled.pid)
        assert PeerGuard(host_pid=1, cgroup_tag="toolhost-none").refusal(walled.pid) == ""
    finally:
        stop(walled)
