"""``toolhost serve`` end to end: a plain socket client, the CLI, and SIGKILL of the host."""

import hashlib
import json
import os
import signal
import socket
import stat

import psutil
import trio

from supervisor.client import open_client
from tests.conftest import echo, pid_alive, script, write_registry
from tests.e2e.conftest import cli, serve

UTILITY = {
    "command": "python",
    "args": ["-m", "sidecars.utility"],
    "tools": ["file.hash", "archive.create", "archive.extract", "data.convert"],
}


def plain_call(path, request):
    """A client with nothing but the standard library: one JSON line out, one line back."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(30)
        s.connect(str(path))
        s.sendall(json.dumps(request).encode() + b"\n")
        buf = b""
        while not buf.endswith(b"\n"):
            chunk = s.recv(65536)
            assert chunk, "host closed the connection"
            buf += chunk
        return json.loads(buf)


async def wait_visible(sock, tools, timeout=30):
    """Wait for tools to become visible using the catalog subscription (no polling)."""
    async with open_client(sock) as client:
        await client.subscribe()
        with trio.fail_after(timeout):
            while True:
                cat = await client.catalog()
                if all(any(d.name == t and d.visible for d in cat.tools) for t in tools):
                    return cat
                await client.events.receive()


def test_serve_invoke_file_hash_matches_hashlib(tmp_path):
    root = tmp_path / "app"
    (root / "workspace" / "data").mkdir(parents=True)
    payload = os.urandom(200_000)
    (root / "workspace" / "data" / "blob.bin").write_bytes(payload)
    write_registry(root, {"utility": UTILITY})
    with serve(root):
        sock = root / ".toolhost" / "host.sock"
        assert stat.S_IMODE(os.stat(sock).st_mode) == 0o600
        assert stat.S_IMODE(os.stat(sock.parent).st_mode) == 0o700
        trio.run(wait_visible, sock, ["file.hash"])
        hello = plain_call(sock, {"id": 1, "method": "server.hello", "params": {}})
        assert hello["result"]["protocol"] == "toolhost/1"
        resp = plain_call(
            sock,
            {
                "id": "h",
                "method": "tools.invoke",
                "params": {"tool": "file.hash", "input": {"path": "data/blob.bin"}},
            },
        )
        assert resp["id"] == "h"
        env = resp["result"]
        assert env["status"] == "success", env
        assert env["data"]["digest"] == hashlib.sha256(payload).hexdigest()
        resp = plain_call(
            sock,
            {
                "id": 2,
                "method": "tools.invoke",
                "params": {"tool": "file.hash", "input": {"path": "../etc/passwd"}},
            },
        )
        assert (
            resp["result"]["status"] == "failed"
            and resp["result"]["error"]["code"] == "invalid-input"
        )
        # The operator CLI against the same host.
        out = cli(
            root, "invoke", "file.hash", json.dumps({"path": "data/blob.bin", "algorithm": "md5"})
        )
        assert out.returncode == 0, out.stderr
        assert json.loads(out.stdout)["data"]["digest"] == hashlib.md5(payload).hexdigest()
        out = cli(root, "invoke", "file.hash", '{"path": "missing.bin"}')
        assert out.returncode == 1 and json.loads(out.stdout)["status"] == "failed"
        out = cli(root, "invoke", "no.such.tool", "{}")
        assert out.returncode == 2 and json.loads(out.stdout)["error"]["code"] == "unknown-tool"
        status = cli(root, "status")
        assert status.returncode == 0
        assert (
            "utility" in status.stdout
            and "file.hash" in status.stdout
            and "available" in status.stdout
        )
        data = json.loads(cli(root, "status", "--json").stdout)
        assert {t["name"] for t in data["tools"]} >= {"file.hash", "data.convert"}
    # Stopped cleanly: the socket is gone.
    assert not sock.exists()


def test_cli_without_host(tmp_path):
    root = tmp_path / "app"
    root.mkdir()
    out = cli(root, "status")
    assert out.returncode == 3 and "no host is serving" in out.stderr


def test_sigkill_of_the_host_leaves_no_process(tmp_path):
    root = tmp_path / "app"
    root.mkdir()
    write_registry(
        root,
        {"echo": echo(pool={"min": 2, "max": 2}), "forker": script("forker", ["forker.pids"])},
    )
    with serve(root) as proc:
        sock = root / ".toolhost" / "host.sock"
        cat = trio.run(wait_visible, sock, ["echo.say", "forker.pids"])
        pids = [w.pid for s in cat.sidecars for w in s.workers]
        assert len(pids) == 3
        resp = plain_call(
            sock,
            {"id": 1, "method": "tools.invoke", "params": {"tool": "forker.pids", "input": {}}},
        )
        grandchild = resp["result"]["data"]["child"]
        pids.append(grandchild)
        host = psutil.Process(proc.pid)
        helpers = [c.pid for c in host.children() if c.pid not in pids]  # the warden
        assert all(pid_alive(p) for p in pids)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        procs = []
        for pid in pids + helpers:
            try:
                procs.append(psutil.Process(pid))
            except psutil.NoSuchProcess:
                pass
        _gone, alive = psutil.wait_procs(procs, timeout=10)
        assert alive == [], f"left behind: {[p.pid for p in alive]}"
        assert not any(pid_alive(p) for p in pids)


def test_broken_registry_never_stops_the_host(tmp_path):
    root = tmp_path / "app"
    (root / "tools").mkdir(parents=True)
    (root / "tools" / "external.tools.jsonc").write_text("{ not json at all")
    with serve(root):
        out = cli(root, "status", "--json")
        assert out.returncode == 0
        data = json.loads(out.stdout)
        assert data["registry"]["errors"][0].startswith(
            "tools/external.tools.jsonc: not valid JSONC"
        )


def test_serve_with_websocket_gateway(tmp_path):
    from trio_websocket import open_websocket_url

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    root = tmp_path / "app"
    root.mkdir()
    write_registry(
        root,
        {"echo": echo(tools=["echo.say"])},
        host={"ws": {"listen": f"127.0.0.1:{port}", "tokenFile": ".toolhost/ws.token"}},
    )
    with serve(root):
        sock = root / ".toolhost" / "host.sock"
        trio.run(wait_visible, sock, ["echo.say"])
        token_file = root / ".toolhost" / "ws.token"
        assert stat.S_IMODE(os.stat(token_file).st_mode) == 0o600
        token = token_file.read_text().strip()
        hello = plain_call(sock, {"id": 1, "method": "server.hello", "params": {}})
        assert hello["result"]["capabilities"]["endpoints"]["ws"] == f"ws://127.0.0.1:{port}/ws"

        async def ws_invoke():
            headers = [(b"Authorization", f"Bearer {token}".encode())]
            async with open_websocket_url(f"ws://127.0.0.1:{port}/ws", extra_headers=headers) as ws:
                await ws.send_message(
                    json.dumps(
                        {
                            "id": 1,
                            "method": "tools.invoke",
                            "params": {"tool": "echo.say", "input": {"text": "ws"}},
                        }
                    )
                )
                return json.loads(await ws.get_message())

        resp = trio.run(ws_invoke)
        assert resp["result"]["status"] == "success" and resp["result"]["data"]["text"] == "ws"


def test_sighup_reloads_the_registry(tmp_path):
    root = tmp_path / "app"
    root.mkdir()
    write_registry(root, {"a": echo(tools=["echo.say"])})
    with serve(root) as proc:
        sock = root / ".toolhost" / "host.sock"
        trio.run(wait_visible, sock, ["echo.say"])
        write_registry(root, {"a": echo(tools=["echo.say"]), "b": script("echo", ["echo.fail"])})
        os.kill(proc.pid, signal.SIGHUP)
        cat = trio.run(wait_visible, sock, ["echo.say", "echo.fail"])
        assert {s.id for s in cat.sidecars} == {"a", "b"}
        out = cli(root, "reload", "--json")
        assert out.returncode == 0 and json.loads(out.stdout)["unchanged"] == ["a", "b"]
