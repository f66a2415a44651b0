"""Deployment: sd_notify from a real ``toolhost serve``, health probes (CLI and HTTP), the systemd
unit and the Kubernetes manifests."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import trio

from supervisor.client import open_client
from tests.conftest import REPO, echo, free_port, script, write_registry
from tests.e2e.conftest import TOOLHOST, cli, serve

CI = os.environ.get("CI") == "true"


def _datagrams(sock: socket.socket, until: str, timeout: float = 30) -> list[str]:
    """Notifications received until one contains ``until`` (fails after ``timeout``)."""
    deadline = time.monotonic() + timeout
    got: list[str] = []
    while not any(until in g for g in got):
        left = deadline - time.monotonic()
        assert left > 0, f"no {until!r} in {got[-5:]}"
        sock.settimeout(left)
        try:
            got.append(sock.recv(4096).decode())
        except TimeoutError:
            raise AssertionError(f"no {until!r} within {timeout} s; got {got[-5:]}") from None
    return got


def test_sd_notify_ready_status_watchdog_stopping(app, tmp_path):
    write_registry(app, {"echo": echo()})
    path = str(tmp_path / "notify.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(path)
        env = {"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "200000"}
        with serve(app, env=env) as proc:
            first = _datagrams(sock, "READY=1")
            ready = first[-1].split("\n")
            assert ready[0] == "READY=1"
            assert re.match(r"STATUS=\d+ tools available", ready[1])
            assert not any("WATCHDOG" in g or "STOPPING" in g for g in first[:-1])
            # STATUS follows the catalog until the five echo tools are available; the watchdog
            # pings every half WATCHDOG_USEC meanwhile.
            # (On a loaded machine the worker can be ready before READY=1 is sent: then READY's
            # own datagram already says so and no later STATUS change comes.)
            done = "STATUS=5 tools available"
            later = [] if done in first[-1] else _datagrams(sock, done)
            later += _datagrams(sock, "WATCHDOG=1")
            proc.send_signal(signal.SIGTERM)
            stopping = _datagrams(sock, "STOPPING=1")
            assert proc.wait(timeout=20) == 0
    order = [g.split("\n")[0].split("=")[0] for g in first + later + stopping]
    assert order.index("READY") < order.index("WATCHDOG") < order.index("STOPPING")
    assert order[-1] == "STOPPING"


def _probe(root: Path, kind: str) -> tuple[int, dict]:
    proc = cli(root, "health", f"--{kind}", "--no-global")
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 1, proc.stdout + proc.stderr
    return proc.returncode, json.loads(lines[0])


def _http(port: int, path: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


async def _wait_sidecar(sock: Path, tool: str, state: str) -> None:
    """Wait on catalog.changed events (no polling) until ``tool`` is ``state``."""
    async with open_client(sock) as client:
        await client.subscribe()
        with trio.fail_after(40):
            while True:
                cat = await client.catalog()
                if any(d.name == tool and d.stability.effective == state for d in cat.tools):
                    return
                await client.events.receive()


def test_health_ready_follows_a_critical_sidecar(app):
    port = free_port()
    write_registry(
        app,
        {
            "echo": echo(),
            "flaky": script(
                "flaky",
                ["flaky.work"],
                critical=True,
                restart={"backoffMs": 10, "maxBackoffMs": 100, "intensity": 1},
            ),
        },
        host={"ws": {"listen": f"127.0.0.1:{port}"}},
    )
    sock = app / ".toolhost" / "host.sock"
    # No host: neither live nor ready, one JSON line, exit 1.
    code, body = _probe(app, "live")
    assert (code, body["live"]) == (1, False)
    with serve(app):
        trio.run(_wait_sidecar, sock, "flaky.work", "unavailable")
        code, body = _probe(app, "live")
        assert (code, body["live"]) == (0, True)
        code, body = _probe(app, "ready")
        assert code == 1
        assert body["ready"] is False and body["notReady"] == ["flaky"]
        assert _http(port, "/healthz")[0] == 200
        status, body = _http(port, "/readyz")
        assert status == 503 and body["critical"] == {"flaky": "unavailable"}

        # The critical sidecar comes up: ready.
        (app / "fixed").write_text("")
        trio.run(_wait_sidecar, sock, "flaky.work", "available")
        code, body = _probe(app, "ready")
        assert (code, body["ready"]) == (0, True)
        assert _http(port, "/readyz") == (200, {**body, "probe": "ready"})

        # It dies and cannot come back: not ready again; then it returns.
        (app / "fixed").unlink()
        pid = json.loads(cli(app, "status", "--json").stdout)["sidecars"]
        worker = next(s for s in pid if s["id"] == "flaky")["workers"][0]["pid"]
        os.kill(worker, signal.SIGKILL)
        trio.run(_wait_sidecar, sock, "flaky.work", "unavailable")
        assert _probe(app, "ready")[0] == 1
        assert _http(port, "/readyz")[0] == 503
        (app / "fixed").write_text("")
        trio.run(_wait_sidecar, sock, "flaky.work", "available")
        assert _probe(app, "ready")[0] == 0
        # The WebSocket gateway on the same port still works.
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/ws", timeout=10)
        except urllib.error.HTTPError as exc:
            assert exc.code in (400, 426), exc.code
        else:
            pytest.fail("a plain GET of /ws must not succeed")


def test_kubernetes_manifests_validate():
    folder = REPO / "deploy" / "kubernetes"
    files = sorted(str(p) for p in folder.glob("*.yaml"))
    assert len(files) >= 3
    proc = subprocess.run(
        [sys.executable, "-m", "kubernetes_validate", "--strict", *files],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    kinds = {line.split("resource ")[1].split("/")[0] for line in proc.stdout.splitlines()}
    assert {"deployment", "service", "configmap"} <= kinds


def test_kubernetes_registry_configmap_is_a_valid_registry(tmp_path):
    import yaml  # kubernetes-validate depends on PyYAML

    doc = yaml.safe_load((REPO / "deploy" / "kubernetes" / "configmap.yaml").read_text())
    (tmp_path / "tools").mkdir()
    (tmp_path / "tools" / "external.tools.jsonc").write_text(doc["data"]["external.tools.jsonc"])
    from supervisor.registry.load import load_registry

    reg = load_registry(str(tmp_path), use_global=False)
    assert reg.errors == []
    assert reg.sidecars["utility"].config.critical is True
    assert reg.host.confinement == "required"  # issue 28: deploy confines every sidecar


def test_systemd_unit_verifies(tmp_path):
    if shutil.which("systemd-analyze") is None:
        if CI:
            pytest.fail("systemd-analyze missing in CI (.ci/run installs systemd)")
        pytest.skip("systemd-analyze not installed (apt-get install systemd)")
    unit = (REPO / "deploy" / "systemd" / "toolhost.service").read_text()
    for key in ("Type=notify", "WatchdogSec=", "NoNewPrivileges=yes", "ProtectSystem=strict"):
        assert key in unit
    assert "PrivateTmp=yes" in unit and "RuntimeDirectory=toolhost" in unit
    assert "--socket /run/toolhost/host.sock" in unit
    # verify checks that ExecStart exists: point it at this environment's toolhost.
    exe = shutil.which("toolhost") or str(Path(sys.executable).parent / "toolhost")
    local = tmp_path / "toolhost.service"
    local.write_text(unit.replace("/usr/local/bin/toolhost", exe))
    proc = subprocess.run(
        ["systemd-analyze", "verify", str(local)], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert "toolhost.service" not in proc.stderr, proc.stderr


def test_containerfile_runs_toolhost_serve_as_non_root():
    text = (REPO / "deploy" / "Containerfile").read_text()
    assert re.search(r"^FROM \S+-slim-bookworm$", text, re.M)
    user = re.search(r"^USER (\S+)", text, re.M)
    assert user is not None and not user.group(1).startswith(("0", "root"))
    assert 'ENTRYPOINT ["toolhost"]' in text
    assert re.search(r'^CMD \["serve"', text, re.M)
    # Every path it copies exists in the repository.
    for line in text.splitlines():
        if line.startswith("COPY "):
            for src in line.split()[1:-1]:
                assert (REPO / src).exists(), src


def test_toolhost_help_lists_the_deploy_commands():
    out = subprocess.run([*TOOLHOST, "--help"], capture_output=True, text=True, timeout=30).stdout
    assert "health" in out and "mcp" in out
