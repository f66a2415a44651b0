"""Issue 28: the walls hold for a normal user too. CI runs as root, so this test drops to an
unprivileged uid (``setpriv``) and runs a small confined host there, whose hostile sidecar
fails every attack (Landlock and seccomp need no privilege; the network namespace comes from a
user namespace, the process limit from ``RLIMIT_NPROC``); with ``host.confinement: off`` the
same attacks succeed. Skipped when not root (the whole suite then runs as a normal user)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from tests.integration.confine_kit import HOSTILE, KERNEL, need

NOBODY = 65534
REPO = Path(__file__).resolve().parents[2]
RUNNER = HOSTILE.parent / "nonroot_host.py"
TASKS = HOSTILE.parent / "nonroot_tasks.py"
SIDECAR = HOSTILE.parent / "hostile_sidecar.py"
SITE = Path(msgspec.__file__).resolve().parents[1]
"""The virtual environment's site-packages (the unprivileged host imports from it)."""


def setpriv(*argv: str) -> list[str]:
    return ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", *argv]


def reachable(path: str) -> bool:
    """Every folder above ``path`` lets others through and ``path`` lets others run it."""
    real = Path(os.path.realpath(path))
    return all(p.stat().st_mode & 0o001 for p in real.parents) and bool(real.stat().st_mode & 0o001)


def interpreter() -> str | None:
    """A Python of this version an unprivileged user may run (this one may live under a 0700
    home, as pyenv's does under /root)."""
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    here = os.path.realpath(sys.executable)
    for candidate in (here, f"/usr/bin/{version}", f"/usr/local/bin/{version}"):
        if not os.path.exists(candidate) or not reachable(candidate):
            continue
        done = subprocess.run(
            setpriv(candidate, "-c", "import msgspec, trio"),
            env={"PATH": "/usr/bin:/bin", "PYTHONPATH": f"{REPO}:{SITE}"},
            capture_output=True,
            check=False,
        )
        if done.returncode == 0:
            return candidate
    return None


@pytest.fixture
def place() -> Iterator[Path]:
    """A folder an unprivileged user owns (pytest's tmp_path is root's, mode 0700)."""
    root = Path(tempfile.mkdtemp(prefix="toolhost-nonroot-", dir="/tmp"))
    try:
        root.chmod(0o755)
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def run_as_nobody(
    place: Path,
    python: str,
    confinement: str,
    attacks: dict[str, Any],
    confine: dict[str, Any] | None = None,
) -> Any:
    app, home, bin_dir = place / "app", place / "home", place / "bin"
    for d in (app / ".toolhost", home / ".ssh", bin_dir):
        d.mkdir(parents=True, exist_ok=True)
    (home / ".ssh" / "id_ed25519").write_text("-----BEGIN OPENSSH PRIVATE KEY-----\nsecret\n")
    (app / ".toolhost" / "vault.json").write_text("{}")
    (bin_dir / "python").unlink(missing_ok=True)
    (bin_dir / "python").symlink_to(python)
    for path in [place, *place.rglob("*")]:
        os.lchown(path, NOBODY, NOBODY)
    pythonpath = f"{REPO}:{SITE}"
    entry = {
        "command": "python",
        "args": [str(SIDECAR)],
        "tools": ["hostile.attack"],
        "env": {"PYTHONPATH": pythonpath},
    }
    if confine is not None:
        entry["confine"] = confine
    spec = {"confinement": confinement, "entry": entry, "attacks": attacks}
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(home), "PYTHONPATH": pythonpath}
    done = subprocess.run(
        setpriv(python, str(RUNNER), str(app), json.dumps(spec)),
        env=env,
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr.decode()
    return json.loads(done.stdout.decode().strip().splitlines()[-1])


def attacks(place: Path, tcp: socket.socket, udp: socket.socket) -> dict[str, Any]:
    return {
        "unix_socket": {"kind": "unix", "path": str(place / "k.sock")},
        "key": {"kind": "read", "path": str(place / "home" / ".ssh" / "id_ed25519")},
        "vault": {"kind": "read", "path": str(place / "app" / ".toolhost" / "vault.json")},
        "write_outside": {"kind": "write", "path": str(place / "app" / "planted.txt")},
        "tcp": {"port": tcp.getsockname()[1]},
        "udp": {"port": udp.getsockname()[1]},
        "signal": {"pid": "host"},
        "environ": {"pid": "host"},
        "ptrace": {"pid": "host"},
        "unshare": {},
        "cat": {"path": str(place / "home" / ".ssh" / "id_ed25519")},
        "bomb": {"kind": "fork_bomb", "max": 300},
    }


def unix_listener(place: Path) -> socket.socket:
    """A Unix socket the unprivileged user may connect to (as the kernel socket is its
    host's): without confinement it reaches it, confined ``socket(AF_UNIX)`` is refused."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(place / "k.sock"))
    sock.listen(4)
    os.chown(place / "k.sock", NOBODY, NOBODY)
    return sock


def listeners() -> tuple[socket.socket, socket.socket]:
    tcp = socket.socket()
    tcp.bind(("127.0.0.1", 0))
    tcp.listen(4)
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind(("127.0.0.1", 0))
    for s in (tcp, udp):
        s.setblocking(False)
    return tcp, udp


def nothing_came(s: socket.socket) -> bool:
    try:
        if s.type == socket.SOCK_STREAM:
            s.accept()[0].close()
        else:
            s.recv(64)
    except BlockingIOError:
        return True
    return False


@pytest.fixture
def python() -> str:
    if os.geteuid() != 0:
        pytest.skip("not root: the whole suite runs as a normal user already")
    if shutil.which("setpriv") is None:
        pytest.skip("setpriv (util-linux) is not installed")
    found = interpreter()
    if found is None:
        pytest.skip(f"no python{sys.version_info[0]}.{sys.version_info[1]} uid {NOBODY} may run")
    return found


def test_the_walls_hold_for_a_normal_user(place: Path, python: str) -> None:
    need(KERNEL.landlock_abi >= 6, "Landlock ABI 6 (Linux 6.12)")
    need(bool(KERNEL.seccomp and KERNEL.arch), "seccomp filters on x86_64/aarch64")
    tcp, udp = listeners()
    with tcp, udp, unix_listener(place):
        out = run_as_nobody(place, python, "best-effort", attacks(place, tcp, udp))
        quiet = nothing_came(tcp) and nothing_came(udp)
    assert out["uid"] == NOBODY and out["kernel"]["root"] is False
    assert out["status"] == "success", out
    results = out["results"]
    bomb = results.pop("bomb")
    assert results == {
        "unix_socket": "EPERM",
        "key": "EACCES",
        "vault": "EACCES",
        "write_outside": "EACCES",
        "tcp": "EPERM",
        "udp": "EPERM",
        "signal": "EPERM",
        "environ": "EACCES",
        "ptrace": "EPERM",
        "unshare": "EPERM",
        "cat": "EACCES",
    }
    assert bomb.startswith("EAGAIN:") and int(bomb.split(":")[1]) < 300, bomb
    assert quiet and not (place / "app" / "planted.txt").exists()
    facts = out["facts"]
    walls = (facts["filesystem"], facts["syscalls"], facts["noNewPrivs"])
    assert walls == ("enforced", "filtered", True)
    if out["kernel"]["netns"]:  # user namespaces allowed: a namespace of its own
        assert out["plan"]["netns"] == "user" and facts["network"] == "isolated"
    assert out["plan"]["pids"] == "rlimit"  # no cgroup for a normal user: the backstop


def test_a_normal_users_unix_grant_is_gated(place: Path, python: str) -> None:
    """The Unix socket gate as a normal user: the host reads a worker's memory and takes its
    socket as the parent it is (no privilege), so the granted socket is reached and the other
    refused."""
    need(bool(KERNEL.seccomp and KERNEL.arch), "seccomp filters on x86_64/aarch64")
    granted = place / "x11"
    granted.mkdir()
    x0 = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    x0.bind(str(granted / "X0"))
    x0.listen(4)
    x0.setblocking(False)
    todo = {
        "granted": {"kind": "unix", "path": str(granted / "X0")},
        "other": {"kind": "unix", "path": str(place / "k.sock")},
    }
    with x0, unix_listener(place) as other:
        other.setblocking(False)
        out = run_as_nobody(place, python, "best-effort", todo, {"unix": [str(granted)]})
        reached = not nothing_came(x0)
        quiet = nothing_came(other)
    assert out["status"] == "success", out
    assert out["results"] == {"granted": "ok", "other": "EACCES"}, out["results"]
    assert reached and quiet
    assert not any(m.startswith("confine.unix") for m in out["facts"]["missing"])


def test_without_confinement_the_same_user_reaches_it_all(place: Path, python: str) -> None:
    tcp, udp = listeners()
    todo = attacks(place, tcp, udp)
    del todo["bomb"], todo["unshare"]  # unbounded, and needs privileges anyway
    with tcp, udp, unix_listener(place):
        out = run_as_nobody(place, python, "off", todo)
        quiet = nothing_came(tcp) and nothing_came(udp)
    assert out["status"] == "success", out
    assert out["results"] == {name: "ok" for name in todo}, out["results"]
    assert not quiet and (place / "app" / "planted.txt").exists()
    assert out["facts"] is None


def test_a_normal_users_confined_tasks_survive_a_worker_restart_and_cancel(
    place: Path, python: str
) -> None:
    """task.background confined as a normal user: no pids cgroup, so nothing empties the
    worker's group (``keep`` is moot: docs/confinement.md, Processes); the keeper survives the
    worker, and the replacement, in another Landlock domain, still cancels it (its FIFO)."""
    need(KERNEL.landlock_abi >= 6, "Landlock ABI 6 (Linux 6.12)")
    app, bin_dir = place / "app", place / "bin"
    for d in (app, bin_dir):
        d.mkdir(parents=True, exist_ok=True)
    (bin_dir / "python").symlink_to(python)
    for path in [place, *place.rglob("*")]:
        os.lchown(path, NOBODY, NOBODY)
    pythonpath = f"{REPO}:{SITE}"
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(place), "PYTHONPATH": pythonpath}
    done = subprocess.run(
        setpriv(python, str(TASKS), str(app), "best-effort"),
        env=env,
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    out = json.loads(done.stdout.decode().strip().splitlines()[-1])
    assert out["uid"] == NOBODY and out["plan"] == {"pids": "rlimit", "keep": "host"}, out
    assert out["afterRestart"] == "running" and out["keeperAlive"], out
    assert out["cancelled"]["reason"] == "cancelled", out
    assert not out["keeperAliveAfterCancel"], out
