"""Issue 28, through the real host: a hostile sidecar hosted as process-json (and as a per-call
oneshot), started by the host's spawn path behind its walls, called over the kernel socket,
fails each attack; with ``host.confinement: off`` the same attacks succeed."""

from __future__ import annotations

import http.server
import json
import os
import socket
import threading
from pathlib import Path
from typing import Any

import msgspec
import pytest
import trio

from supervisor.calls.call import InvokeRequest
from supervisor.processes import unix_gate, zygote
from supervisor.processes.confine import probe
from tests.conftest import raw, running_host, wait_available
from tests.integration.confine_kit import HOSTILE, need
from tests.kernel import served

KERNEL = probe()
ROOT = os.geteuid() == 0
SIDECAR = str(HOSTILE.parent / "hostile_sidecar.py")
SIMPLE = str(HOSTILE.parent / "hostile_simple.py")
MCP = str(HOSTILE.parent / "hostile_mcp.py")


def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    app, home = tmp_path / "app", tmp_path / "home"
    for d in (app / ".toolhost", app / "workspace", home / ".ssh"):
        d.mkdir(parents=True)
    key = home / ".ssh" / "id_ed25519"
    key.write_text("-----BEGIN OPENSSH PRIVATE KEY-----\nsecret\n")
    vault = app / ".toolhost" / "vault.json"
    vault.write_text("{}")
    token = app / ".toolhost" / "operator.token"
    token.write_text("operator-secret\n")
    for f in (vault, token):
        f.chmod(0o600)
    (app / ".toolhost" / "ws.token").write_text("ws-secret-token\n")
    (app / ".toolhost" / "ws.token").chmod(0o600)
    monkeypatch.setenv("HOME", str(home))
    return {"app": app, "home": home, "key": key, "vault": vault, "token": token}


def listener(kind: int) -> socket.socket:
    s = socket.socket(socket.AF_INET, kind)
    s.bind(("127.0.0.1", 0))
    if kind == socket.SOCK_STREAM:
        s.listen(4)
    s.setblocking(False)
    return s


def nothing_came(s: socket.socket) -> bool:
    try:
        if s.type == socket.SOCK_STREAM:
            conn, _ = s.accept()
            conn.close()
        else:
            s.recv(64)
    except BlockingIOError:
        return True
    return False


def attacks(w: dict[str, Path], sock: Path, tcp: socket.socket, udp: socket.socket, ws: int):
    host = os.getpid()
    return {
        "key": {"kind": "read", "path": str(w["key"])},
        "vault": {"kind": "read", "path": str(w["vault"])},
        "token": {"kind": "read", "path": str(w["token"])},
        "write_outside": {"kind": "write", "path": str(w["app"] / "planted.txt")},
        "kernel_socket": {"kind": "unix", "path": str(sock)},
        "tcp": {"port": tcp.getsockname()[1]},
        "udp": {"port": udp.getsockname()[1]},
        "gateway": {"kind": "tcp", "port": ws},
        "signal": {"pid": host},
        "environ": {"pid": host},
        "unshare": {},
        "cat": {"path": str(w["key"])},
        "tmpdir": {},
    }


DENIED = {
    "key": "EACCES",
    "vault": "EACCES",
    "token": "EACCES",
    "write_outside": "EACCES",
    "kernel_socket": "EPERM",
    "tcp": "EPERM",
    "udp": "EPERM",
    "gateway": "EPERM",
    "signal": "EPERM",
    "environ": "EACCES",
    "unshare": "EPERM",
    "cat": "EACCES",
    "tmpdir": "ok",
}


TOOL = {"persistent": "hostile.attack", "oneshot": "hostile.attack", "simple": "hostile.simple"}
TOOL["mcp"] = "attack"


def entry(mode: str) -> dict[str, Any]:
    e: dict[str, Any] = {
        "command": "python",
        "args": [SIDECAR],
        "tools": [TOOL[mode]],
        "restart": {"backoffMs": 20, "maxBackoffMs": 200},
    }
    if mode == "oneshot":
        e["mode"] = "oneshot"
    elif mode == "simple":
        e.update(protocol="simple-json", args=[SIMPLE], probe={"timeoutMs": 5000})
    elif mode == "mcp":
        e.update(protocol="mcp", args=[MCP], probe={"startTimeoutMs": 20_000})
        del e["tools"]
    return e


SPAWNS = [
    "shim",
    pytest.param(
        "zygote",
        marks=pytest.mark.skipif(
            zygote.forced_exec() or zygote.platform_problem() is not None,
            reason=f"no zygote: {zygote.platform_problem() or 'TOOLHOST_SPAWN=exec'}",
        ),
    ),
]
"""How the walls go up: the exec shim (no zygote), or the zygote's child (a persistent worker
forked and run in its interpreter; the other protocols forked, walled and exec'd there)."""


def host_config(confinement: str, spawn: str) -> dict[str, Any]:
    if spawn == "shim":
        return {"confinement": confinement, "zygote": {"enabled": False}}
    # Patient: on a loaded machine a slow answer would (correctly) send the start to the shim.
    return {"confinement": confinement, "zygote": {"replyTimeoutMs": 1000}}


def assert_started_by(host: Any, spawn: str, mode: str, confinement: str) -> None:
    """The start took the path the test is about (not a fallback)."""
    ws = next(s for s in host.views.snapshot().sidecars if s.id == "hostile").workers
    if spawn == "shim":
        assert host.zygote is None
        assert all(w.startedBy == "exec" for w in ws)
        return
    z = host.zygote
    assert z is not None and z.fallbacks == 0, z.status()
    if mode == "persistent":
        assert [w.startedBy for w in ws] == ["zygote"] and z.forks >= 1
    elif confinement != "off":  # forked, walled and exec'd by the zygote, not by the shim
        assert z.execs >= 1 and all(w.startedBy == "exec" for w in ws)


async def attack_through_host(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    confinement: str,
    mode: str,
    spawn: str = "shim",
) -> tuple[dict[str, str], bool, bool]:
    w = world(tmp_path, monkeypatch)
    tcp, udp = listener(socket.SOCK_STREAM), listener(socket.SOCK_DGRAM)
    host_cfg = host_config(confinement, spawn)
    async with (
        running_host(w["app"], {"hostile": entry(mode)}, host=host_cfg) as host,
        served(host, w["app"]) as srv,
    ):
        await wait_available(host, TOOL[mode], timeout=40)
        facts = host.catalog.get(TOOL[mode]).stability.details.confinement
        async with srv.peer("unix-json") as kernel:
            todo = attacks(w, srv.sock, tcp, udp, srv.ws_port)
            got = await kernel.request(
                1, "tools.invoke", {"tool": TOOL[mode], "input": {"attacks": todo}}
            )
        assert_started_by(host, spawn, mode, confinement)
    result = got["result"]
    assert result["status"] == "success", result
    data = result.get("data")
    if mode == "mcp" or not isinstance(data, dict) or "key" not in data:
        data = json.loads(result["content"])
    quiet = nothing_came(tcp) and nothing_came(udp)
    planted = (w["app"] / "planted.txt").exists()
    tcp.close()
    udp.close()
    if mode in ("persistent", "mcp"):  # a long-lived worker: read back from it
        if confinement == "off":
            assert facts is None
        else:
            assert facts is not None and facts.mode == "best-effort", facts
            assert facts.filesystem == "enforced" and facts.syscalls == "filtered"
            assert facts.no_new_privs and facts.network == "isolated"
    return data, quiet, planted


@pytest.mark.parametrize("spawn", SPAWNS)
@pytest.mark.parametrize("mode", ["persistent", "oneshot", "simple", "mcp"])
async def test_a_hostile_process_json_sidecar_fails_every_attack(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str, spawn: str
) -> None:
    need(KERNEL.landlock_abi >= 6, "Landlock ABI 6 (Linux 6.12)")
    need(bool(KERNEL.seccomp and KERNEL.arch), "seccomp filters on x86_64/aarch64")
    data, quiet, planted = await attack_through_host(
        tmp_path, monkeypatch, "best-effort", mode, spawn
    )
    assert data == DENIED
    assert quiet and not planted


@pytest.mark.parametrize("spawn", SPAWNS)
@pytest.mark.parametrize("mode", ["persistent", "simple", "mcp"])
async def test_with_confinement_off_the_same_attacks_succeed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str, spawn: str
) -> None:
    data, quiet, planted = await attack_through_host(tmp_path, monkeypatch, "off", mode, spawn)
    expected = {name: "ok" for name in DENIED}
    data.pop("tmpdir")  # no private TMPDIR without confinement
    expected.pop("tmpdir")
    if not ROOT:
        data.pop("unshare")
        expected.pop("unshare")
    assert data == expected
    assert not quiet and planted


class _Page(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = b"hello"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def http_server() -> http.server.ThreadingHTTPServer:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Page)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


async def reach_through_proxy(host: Any, allowed: int, other: int) -> tuple[dict, Any]:
    """The hostile sidecar (granted ``allowed``) fetches the allowed server and ``other``
    through its proxy and connects to ``allowed`` directly: what each attempt met, and the
    sidecar's egress counts once both connections are recorded."""
    todo = {
        "allowed": {"kind": "http", "url": f"http://127.0.0.1:{allowed}/"},
        "other": {"kind": "http", "url": f"http://127.0.0.1:{other}/"},
        "direct": {"kind": "tcp", "port": allowed},
    }
    env = await host.invoker.invoke(InvokeRequest("hostile.attack", raw({"attacks": todo})))
    assert env.status == "success", env
    data = msgspec.json.decode(env.data)
    with trio.move_on_after(5):  # an allowed connection is recorded when it closes
        while (s := host.egress.statistics()["hostile"]).refused < 1 or s.open:
            await trio.sleep(0.02)
    return data, host.egress.statistics()["hostile"]


def egress_lines(app: Path) -> list[dict]:
    """The ``egress`` records of the host's audit log."""
    lines = [json.loads(x) for x in (app / ".toolhost" / "audit.jsonl").read_text().splitlines()]
    return [x for x in lines if x.get("event") == "egress"]


async def test_network_allow_reaches_only_the_allowed_server_through_the_proxy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    need(KERNEL.landlock_abi >= 6, "Landlock ABI 6 (Linux 6.12)")
    need(bool(KERNEL.netns), "network namespaces")
    w = world(tmp_path, monkeypatch)
    allowed, other = http_server(), http_server()
    a, o = allowed.server_address[1], other.server_address[1]
    e = entry("persistent")
    e["confine"] = {"network": {"allow": [f"127.0.0.1:{a}"]}}
    host_cfg = {
        "confinement": "best-effort",
        "zygote": {"enabled": False},
        "auditLog": ".toolhost/audit.jsonl",
    }
    try:
        async with running_host(w["app"], {"hostile": e}, host=host_cfg) as host:
            await wait_available(host, "hostile.attack")
            data, stats = await reach_through_proxy(host, a, o)
            if host.audit is not None:
                host.audit.flush()
    finally:
        allowed.shutdown()
        other.shutdown()
    assert data["allowed"] == "ok:200:hello"
    assert data["other"] == "HTTP 403"
    assert data["direct"] in ("ECONNREFUSED", "ENETUNREACH"), data
    assert stats.connections == 1 and stats.refused == 1 and stats.bytes_in > 0
    egress = egress_lines(w["app"])
    # a refusal is recorded as it is answered, an allowed connection when it closes
    assert sorted((x["allowed"], x["port"]) for x in egress) == [(False, o), (True, a)]


@pytest.mark.parametrize("spawn", SPAWNS)
@pytest.mark.parametrize("confinement", ["best-effort", "off"])
async def test_a_unix_grant_does_not_open_the_kernel_socket(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, confinement: str, spawn: str
) -> None:
    """Landlock does not control ``connect`` on a socket file, so a sidecar granted ``unix`` (as
    the computer family is, for the X server) can name the kernel socket: the socket itself
    refuses it (``unauthorized``), and no call of its reaches the audit log. With confinement
    off the same sidecar calls a tool through it (so the test tests something). The Unix
    socket gate, which refuses that connect first (``test_confine_unix_gate.py``), is turned
    off here, as on a kernel without ``pidfd_getfd``: this is the wall behind it."""
    need(KERNEL.landlock_abi >= 6, "Landlock ABI 6 (Linux 6.12)")
    need(bool(KERNEL.seccomp and KERNEL.arch), "seccomp filters on x86_64/aarch64")
    monkeypatch.setattr(unix_gate, "available", lambda: "turned off by the test")
    w = world(tmp_path, monkeypatch)
    e = entry("persistent")
    e["pool"] = {"min": 1, "max": 2}  # with confinement off, a second worker runs the inner call
    e["confine"] = {"unix": [str(w["app"] / "x11.sock")]}
    host_cfg = {**host_config(confinement, spawn), "auditLog": ".toolhost/audit.jsonl"}
    async with (
        running_host(w["app"], {"hostile": e}, host=host_cfg) as host,
        served(host, w["app"]) as srv,
    ):
        await wait_available(host, "hostile.attack", timeout=40)
        assert_started_by(host, spawn, "persistent", confinement)
        inner = {"tool": "hostile.attack", "input": {"attacks": {}}}
        todo = {"kernel_socket": {"kind": "invoke", "path": str(srv.sock), **inner}}
        env = await host.invoker.invoke(InvokeRequest("hostile.attack", raw({"attacks": todo})))
        assert env.status == "success", env
        data = msgspec.json.decode(env.data)
        if host.audit is not None:
            host.audit.flush()
    audit = (w["app"] / ".toolhost" / "audit.jsonl").read_text().splitlines()
    calls = [x for x in map(json.loads, audit) if x.get("tool") == "hostile.attack"]
    if confinement == "off":
        assert data == {"kernel_socket": "ok"}
        assert len(calls) == 2
    else:
        assert data == {"kernel_socket": "unauthorized"}
        assert len(calls) == 1
