"""Shared pieces of the confinement tests: a world with secrets to steal, the hostile program,
and the two ways a spawn path puts walls up (the exec shim; a fork that applies them itself,
as a zygote child does)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import msgspec
import pytest

from supervisor.contracts.confine import ConfinePlan, KernelFacts, Layout, Profile
from supervisor.policy.confine import resolve
from supervisor.processes.confine import install_paths, probe, shim_argv
from supervisor.processes.walls import Walls, arm, read_report

REPO = Path(__file__).resolve().parents[2]
HOSTILE = REPO / "tests" / "fixtures" / "confine" / "hostile.py"
KERNEL = probe()
ROOT = os.geteuid() == 0


def need(ok: bool, what: str) -> None:
    """Skip when this kernel lacks ``what`` - except under CI, where it must be there."""
    if ok:
        return
    if os.environ.get("CI") == "true":
        raise RuntimeError(f"the CI kernel lacks {what}; confinement tests never skip in CI")
    pytest.skip(f"this kernel lacks {what}")


class World(msgspec.Struct, kw_only=True):
    """A temp app root and $HOME with things a sidecar must not reach."""

    root: Path
    app: Path
    home: Path
    project: Path
    key: Path
    vault: Path
    token: Path
    tmpdir: Path

    def layout(self, program: str = str(HOSTILE)) -> Layout:
        state = str(self.app / ".toolhost")
        return Layout(
            app_root=str(self.app),
            project_dir=str(self.project),
            cwd=str(self.app),
            program=program,
            home=str(self.home),
            install=install_paths(),
            secrets=(state, str(self.app / "tools" / "external.tools.jsonc")),
            host_private=(state, str(self.app / "tools"), str(self.app / "manifests")),
        )

    def plan(
        self, profile: Profile, *, kernel: KernelFacts = KERNEL, mode: str = "best-effort"
    ) -> ConfinePlan:
        return resolve(
            "hostile",
            profile,
            mode=mode,  # type: ignore[arg-type]
            kernel=kernel,
            layout=self.layout(),
            listdir=lambda p: os.listdir(p) if os.path.isdir(p) else None,
            realpath=os.path.realpath,
        )

    def env(self) -> dict[str, str]:
        return {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(self.home),
            "TMPDIR": str(self.tmpdir),
        }


def make_world(tmp_path: Path) -> World:
    root = tmp_path
    app = root / "app"
    home = root / "home"
    for d in (app / ".toolhost", app / "workspace", app / "tools", home / ".ssh", root / "tmp"):
        d.mkdir(parents=True)
    key = home / ".ssh" / "id_ed25519"
    key.write_text("-----BEGIN OPENSSH PRIVATE KEY-----\nsecret\n")
    vault = app / ".toolhost" / "vault.json"
    vault.write_text('{"shared": {"api": "sk-secret"}}')
    token = app / ".toolhost" / "operator.token"
    token.write_text("operator-secret")
    (app / "tools" / "external.tools.jsonc").write_text('{"schemaVersion": 2}')
    os.chmod(root / "tmp", 0o700)
    return World(
        root=root,
        app=app,
        home=home,
        project=app / "workspace",
        key=key,
        vault=vault,
        token=token,
        tmpdir=root / "tmp",
    )


class Run(msgspec.Struct, kw_only=True):
    status: int
    results: dict[str, str]
    stderr: str
    report: dict[str, Any] | None = None


def _collect(status: int, out: bytes, err: bytes, chan: socket.socket | None) -> Run:
    report = None
    if chan is not None:
        chan.setblocking(False)
        try:
            report = read_report(chan.recv(65536))
        except (BlockingIOError, ValueError):
            pass
        chan.close()
    text = out.decode().strip().splitlines()
    results = json.loads(text[-1]) if text else {}
    return Run(status=status, results=results, stderr=err.decode(), report=report)


def hostile_argv(attacks: Mapping[str, Mapping[str, Any]]) -> list[str]:
    return [sys.executable, str(HOSTILE), json.dumps({"attacks": attacks})]


def run_shim(world: World, walls: Walls | None, attacks: Mapping[str, Mapping[str, Any]]) -> Run:
    """The exec way: ``python -I -S confine_exec.py FD -- argv`` (nothing applied: plain exec)."""
    argv = hostile_argv(attacks)
    chan = child = None
    pass_fds: list[int] = []
    if walls is not None:
        parent, child = socket.socketpair()
        walls.channel = child.fileno()
        r, w = os.pipe()
        os.write(w, walls.dumps())
        os.close(w)
        argv = shim_argv(argv, r)
        pass_fds = [r, child.fileno(), *walls.netns_fds]
        if walls.ruleset_fd >= 0:
            pass_fds.append(walls.ruleset_fd)
        chan = parent
    try:
        done = subprocess.run(
            argv,
            pass_fds=pass_fds,
            env=world.env(),
            cwd=world.app,
            capture_output=True,
            timeout=60,
            check=False,
        )
    finally:
        if child is not None:
            os.close(pass_fds[0])
            child.close()
    return _collect(done.returncode, done.stdout, done.stderr, chan)


def run_forked(world: World, walls: Walls, attacks: Mapping[str, Mapping[str, Any]]) -> Run:
    """The zygote way: fork this (possibly threaded) process, apply the pre-armed walls in the
    child with raw syscalls only, exec the program."""
    argv = hostile_argv(attacks)
    parent, child = socket.socketpair()
    walls.channel = child.fileno()
    armed = arm(walls)
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    env = [f"{k}={v}".encode() for k, v in world.env().items()]
    path = os.fsencode(argv[0])
    args = [os.fsencode(a) for a in argv]
    cwd = os.fsencode(world.app)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os.dup2(out_w, 1)
            os.dup2(err_w, 2)
            os.chdir(cwd)
            armed.apply()
            os.execve(path, args, dict(e.split(b"=", 1) for e in env))
        except BaseException as exc:
            os.write(2, f"child: {exc}\n".encode())
        os._exit(126)
    child.close()
    os.close(out_w)
    os.close(err_w)
    out = _read_all(out_r)
    err = _read_all(err_r)
    _, status = os.waitpid(pid, 0)
    return _collect(os.waitstatus_to_exitcode(status), out, err, parent)


def _read_all(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 65536):
        chunks.append(chunk)
    os.close(fd)
    return b"".join(chunks)


def nothing_waiting(listener: socket.socket) -> bool:
    """No connection (TCP) or datagram (UDP) reached ``listener``."""
    listener.setblocking(False)
    try:
        if listener.type == socket.SOCK_STREAM:
            conn, _ = listener.accept()
            conn.close()
        else:
            listener.recv(64)
    except BlockingIOError:
        return True
    return False


def tcp_listener() -> socket.socket:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(8)
    return s


def udp_listener() -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("127.0.0.1", 0))
    return s


def port(s: socket.socket) -> int:
    value: int = s.getsockname()[1]
    return value


def paths(items: Sequence[Path]) -> list[str]:
    return [str(p) for p in items]
