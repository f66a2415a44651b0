"""Kernel confinement (PROTOCOL 7) with real processes and the real kernel: a hostile program
tries each attack that does not need a running host, behind the walls (put up by the exec shim
and by a forked child, as a zygote does) and without them, so the tests test something."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import pytest

from supervisor.contracts.confine import Profile
from supervisor.contracts.registry import NetworkGrant
from supervisor.processes.confine import (
    SidecarWalls,
    facts,
    own_netns,
    private_tmpdir,
    remove_tmpdir,
    walls_for,
)
from supervisor.processes.pids_cgroup import PidsCgroups
from supervisor.processes.walls import Walls
from tests.integration.confine_kit import (
    HOSTILE,
    KERNEL,
    ROOT,
    World,
    make_world,
    need,
    nothing_waiting,
    port,
    run_forked,
    run_shim,
    tcp_listener,
    udp_listener,
)


def _yama_scope() -> int:
    try:
        with open("/proc/sys/kernel/yama/ptrace_scope") as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return 0


@pytest.fixture
def world(tmp_path: Path) -> World:
    need(KERNEL.landlock_abi >= 6, "Landlock ABI 6 (Linux 6.12)")
    need(bool(KERNEL.seccomp and KERNEL.arch), "seccomp filters on x86_64/aarch64")
    return make_world(tmp_path)


def attacks(w: World, tcp: socket.socket, udp: socket.socket) -> dict[str, dict[str, object]]:
    host = os.getpid()  # this test process stands in for the host
    return {
        "key": {"kind": "read", "path": str(w.key)},
        "vault": {"kind": "read", "path": str(w.vault)},
        "token": {"kind": "read", "path": str(w.token)},
        "registry": {"kind": "read", "path": str(w.app / "tools" / "external.tools.jsonc")},
        "shadow": {"kind": "read", "path": "/etc/shadow"},
        "write_outside": {"kind": "write", "path": str(w.app / "planted.txt")},
        "write_home": {"kind": "write", "path": str(w.home / ".bashrc")},
        "tcp": {"port": port(tcp)},
        "udp": {"port": port(udp)},
        "unix": {"path": str(w.app / ".toolhost" / "host.sock")},
        "dgram": {"path": str(w.root / "journal.sock")},
        "signal": {"pid": host},
        "ptrace": {"pid": host},
        "environ": {"pid": host},
        "unshare": {},
        "mount": {"path": str(w.tmpdir)},
        "cat": {"path": str(w.key)},
    }


DENIED = {
    "key": "EACCES",
    "vault": "EACCES",
    "token": "EACCES",
    "registry": "EACCES",
    "shadow": "EACCES",
    "write_outside": "EACCES",
    "write_home": "EACCES",
    "tcp": "EPERM",  # no inet socket at all for network "none" (and no route in its namespace)
    "udp": "EPERM",
    "unix": "EPERM",  # socket(AF_UNIX) without a unix grant
    "dgram": "EPERM",  # socketpair(AF_UNIX, SOCK_DGRAM) without a unix grant
    "signal": "EPERM",  # Landlock scoping: nothing outside its domain
    "ptrace": "EPERM",
    "environ": "EACCES",
    "unshare": "EPERM",
    "mount": "EPERM",
    "cat": "EACCES",  # children inherit every wall
}


def dgram_listener(w: World) -> socket.socket:
    """A datagram socket at a path, as journald's is."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind(str(w.root / "journal.sock"))
    return s


@pytest.mark.parametrize("way", ["shim", "fork"])
def test_every_attack_fails_behind_the_walls(world: World, way: str) -> None:
    plan = world.plan(Profile(project="write"))
    tcp, udp, journal = tcp_listener(), udp_listener(), dgram_listener(world)
    shared = SidecarWalls(plan, tmp_root=str(world.tmpdir))
    walls, tmpdir = shared.worker()
    world.tmpdir = Path(tmpdir)
    todo = {
        **attacks(world, tcp, udp),
        "write_project": {"kind": "write", "path": str(world.project / "ok.txt")},
        "tmpdir": {},
        "socketpair": {},
        "passwd": {"kind": "read", "path": "/etc/passwd"},
    }
    run = (run_shim if way == "shim" else run_forked)(world, walls, todo)
    assert run.status == 0, run.stderr
    expected = {
        **DENIED,
        "write_project": "ok",
        "tmpdir": "ok",
        "socketpair": "ok",  # trio needs it
        "passwd": "ok",
    }
    assert run.results == expected
    assert nothing_waiting(tcp) and nothing_waiting(udp) and nothing_waiting(journal)
    assert not (world.app / "planted.txt").exists() and (world.project / "ok.txt").exists()
    assert run.report is not None and run.report["errors"] == []
    assert run.report["landlock"] == KERNEL.landlock_abi and run.report["seccomp"]
    assert run.report["nnp"] and run.report["caps"] == ROOT
    assert run.report["netns"] == bool(KERNEL.netns)
    tcp.close()
    udp.close()
    shared.close()
    assert not os.path.exists(tmpdir)


@pytest.mark.parametrize("way", ["shim", "fork"])
def test_a_project_at_the_app_root_lists_its_top_and_nothing_reaches_the_host_files(
    world: World, way: str
) -> None:
    """projectDir "." (issue 28): the app root is granted entry by entry around ``.toolhost/``
    and listed (a module there imports, "." can be archived); the host's files stay out of
    reach: nothing in ``.toolhost/`` is read, made (a missing state file the host would then
    trust), removed or replaced, and nothing is made at the top (Landlock would grant it in
    ``.toolhost/`` too). Only the names show, as ``stat`` shows them anyway."""
    world.project = world.app
    (world.app / "docs").mkdir()
    plan = world.plan(Profile(project="write"))
    assert plan.listed == (str(world.app),)
    state = world.app / ".toolhost"
    shared = SidecarWalls(plan, tmp_root=str(world.tmpdir))
    walls, _ = shared.worker()
    todo = {
        "top": {"kind": "list", "path": str(world.app)},
        "state_names": {"kind": "list", "path": str(state)},
        "vault": {"kind": "read", "path": str(world.vault)},
        "new_state": {"kind": "write", "path": str(state / "quota-state.json")},
        "state_dir": {"kind": "mkdir", "path": str(state / "d")},
        "remove_token": {"kind": "remove", "path": str(world.token)},
        "replace_token": {"kind": "rename", "path": str(world.app / "docs"), "to": str(state)},
        "move_state": {"kind": "rename", "path": str(state), "to": str(world.app / "s")},
        "top_file": {"kind": "write", "path": str(world.app / "new.txt")},
        "top_dir": {"kind": "mkdir", "path": str(world.app / "screenshots")},
        "in_docs": {"kind": "write", "path": str(world.app / "docs" / "a.txt")},
    }
    run = (run_shim if way == "shim" else run_forked)(world, walls, todo)
    shared.close()
    assert run.status == 0, run.stderr
    names = sorted(os.listdir(world.app))
    assert run.results == {
        "top": "ok:" + ",".join(names),
        "state_names": "ok:operator.token,vault.json",
        "vault": "EACCES",
        "new_state": "EACCES",
        "state_dir": "EACCES",
        "remove_token": "EACCES",
        "replace_token": "EACCES",
        "move_state": "EACCES",
        "top_file": "EACCES",
        "top_dir": "EACCES",
        "in_docs": "ok",
    }
    assert sorted(p.name for p in state.iterdir()) == ["operator.token", "vault.json"]
    assert not (world.app / "new.txt").exists() and not (world.app / "screenshots").exists()


def test_the_same_attacks_succeed_with_nothing_applied(world: World) -> None:
    """The control: without walls every attack works (as root; a normal user cannot read
    /etc/shadow, mount or unshare even unconfined), so the test above tests the walls."""
    tcp, udp, journal = tcp_listener(), udp_listener(), dgram_listener(world)
    run = run_shim(world, None, attacks(world, tcp, udp))
    assert run.status == 0, run.stderr
    root_only = {"shadow", "mount", "unshare"}
    if _yama_scope() >= 1:  # a normal user may ptrace only its descendants there
        root_only.add("ptrace")
    expected = {name: "ok" for name in DENIED}
    expected["unix"] = "ENOENT"  # the socket is reachable; nobody listens in this test
    for name in root_only if not ROOT else ():
        expected.pop(name)
        run.results.pop(name)
    assert run.results == expected
    assert not nothing_waiting(tcp) and not nothing_waiting(udp) and not nothing_waiting(journal)
    tcp.close()
    udp.close()


def test_a_fork_bomb_is_bounded_and_leaves_nothing(world: World) -> None:
    groups = PidsCgroups.probe(f"toolhost-test-{os.getpid()}")
    need(groups is not None or not ROOT, "a writable pids cgroup (root ignores RLIMIT_NPROC)")
    plan = world.plan(Profile(processes=16))
    assert plan.pids == ("cgroup" if groups else "rlimit")
    group = groups.create("bomb", plan.processes) if groups else None
    from supervisor.processes.limits import user_tasks

    nproc = user_tasks() + plan.processes if not groups else 0
    walls = walls_for(plan, tmpdir=str(world.tmpdir), cgroup=group, nproc=nproc)
    started = time.monotonic()
    run = run_shim(world, walls, {"bomb": {"kind": "fork_bomb", "max": 300}})
    outcome, count = run.results["bomb"].split(":")
    # RLIMIT_NPROC counts the whole user: processes of it that end meanwhile free slots
    slack = 0 if groups is not None else 16
    assert outcome == "EAGAIN" and int(count) < plan.processes + slack, run.results
    assert time.monotonic() - started < 30
    if groups is not None and group is not None:
        assert PidsCgroups.current(group) == 0
        assert PidsCgroups.remove(group)
        groups.close()
        assert not os.path.exists(group)


def test_the_fork_bomb_runs_free_without_walls(world: World) -> None:
    run = run_shim(world, None, {"bomb": {"kind": "fork_bomb", "max": 100}})
    assert run.results["bomb"] == "ok:100"


def test_facts_are_read_from_the_running_worker(world: World) -> None:
    plan = world.plan(Profile())
    parent, child = socket.socketpair()
    shared = SidecarWalls(plan, tmp_root=str(world.tmpdir))
    walls, _ = shared.worker(channel=child.fileno())
    from supervisor.processes.walls import arm

    armed = arm(walls)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child: confined, then waits for the test
        os.close(w)
        armed.apply()
        os.read(r, 1)
        os._exit(0)
    child.close()
    os.close(r)
    try:
        from supervisor.processes.walls import read_report

        report = read_report(parent.recv(65536))
        got = facts(plan, pid, report)
        assert own_netns(pid) is bool(KERNEL.netns)
        assert (got.filesystem, got.network, got.syscalls, got.no_new_privs) == (
            "enforced",
            "isolated",
            "filtered",
            True,
        )
        assert got.mode == "best-effort" and got.missing == list(plan.missing)
        unconfined = facts(plan, os.getpid(), None)
        assert unconfined.filesystem == "none" and unconfined.syscalls == "none"
    finally:
        os.close(w)
        os.waitpid(pid, 0)
        parent.close()
        shared.close()


def test_required_walls_that_cannot_go_up_stop_the_program(world: World) -> None:
    """Under ``required`` a failed wall aborts before the program runs (exit 126), never
    running it with less than was promised; under best-effort it runs and the report says so."""
    plan = world.plan(Profile())
    bad = walls_for(plan)
    bad.strict, bad.cgroup_procs = True, "/nonexistent/cgroup.procs"
    run = run_shim(world, bad, {"key": {"kind": "read", "path": str(world.key)}})
    assert run.status == 126 and "confinement failed" in run.stderr and run.results == {}
    assert run.report is not None and "pids cgroup" in run.report["errors"][0]
    soft = walls_for(plan)
    soft.cgroup_procs = "/nonexistent/cgroup.procs"
    run = run_shim(world, soft, {"key": {"kind": "read", "path": str(world.key)}})
    assert run.status == 0 and run.results == {"key": "EACCES"}
    assert run.report is not None and any("pids cgroup" in e for e in run.report["errors"])


def test_proxy_and_loopback_grants_are_listeners_in_the_sidecars_namespace(world: World) -> None:
    need(KERNEL.netns != "", "network namespaces")
    plan = world.plan(Profile(network=NetworkGrant(allow=["*"], loopback=[9222])))
    assert plan.netns and plan.proxy_port == 3128
    outside = tcp_listener()  # a port on the host's loopback that was not granted
    shared = SidecarWalls(plan, tmp_root=str(world.tmpdir))
    assert sorted(shared.listeners) == [3128, 9222]
    todo = {
        "proxy": {"kind": "tcp", "port": plan.proxy_port},
        "cdp": {"kind": "tcp", "port": 9222},
        "other": {"kind": "tcp", "port": port(outside)},
        "udp": {"kind": "udp", "port": port(outside)},
    }
    for _ in range(2):  # two workers, one namespace: each one's connection reaches the host
        walls, _tmp = shared.worker()
        run = run_shim(world, walls, todo)
        assert run.status == 0, run.stderr
        # Its own namespace: only the host's listeners answer, the host's port is not there.
        assert run.results == {"proxy": "ok", "cdp": "ok", "other": "ECONNREFUSED", "udp": "ok"}
        assert nothing_waiting(outside)
        for listener in shared.listeners.values():  # the host accepts from outside
            conn, _ = listener.accept()
            assert conn.recv(16) == b"hello"
            conn.close()
    outside.close()
    shared.close()


def test_landlock_tcp_rules_without_a_namespace(world: World) -> None:
    """The fallback for hosts that cannot make namespaces: Landlock's port rules (ABI 4)."""
    need(KERNEL.landlock_abi >= 4, "Landlock ABI 4 (TCP rules)")
    granted, other = tcp_listener(), tcp_listener()
    walls = Walls(
        landlock_abi=KERNEL.landlock_abi,
        read=[
            "/usr",
            "/lib",
            "/lib64",
            "/etc",
            "/proc",
            str(HOSTILE.parent),
            *world.layout().install,
        ],
        devices=["/dev/null", "/dev/urandom"],
        tcp_connect=[port(granted)],
        seccomp_arch=KERNEL.arch,
        sockets="stream",
        allow_unix=False,
    )
    run = run_shim(
        world,
        walls,
        {
            "granted": {"kind": "tcp", "port": port(granted)},
            "other": {"kind": "tcp", "port": port(other)},
            "udp": {"kind": "udp", "port": port(other)},
        },
    )
    assert run.results == {"granted": "ok", "other": "EACCES", "udp": "EPERM"}, run.stderr
    assert not nothing_waiting(granted) and nothing_waiting(other)
    granted.close()
    other.close()


def test_private_tmpdir_is_private_and_removed(tmp_path: Path) -> None:
    path = private_tmpdir("web/../x", root=str(tmp_path))
    assert os.stat(path).st_mode & 0o777 == 0o700 and "/" not in os.path.basename(path)
    (Path(path) / "f").write_text("x")
    remove_tmpdir(path)
    assert not os.path.exists(path)
