"""Every listen failure is one line naming the address, the setting, the cause and the fix, with a
non-zero exit (issue 26, item 12): the gateway port, the socket path, ``toolhost mcp --http``'s
port; and the bench never binds the operator's addresses."""

from __future__ import annotations

import json
import os
import socket
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.conftest import echo, write_registry
from tests.e2e.conftest import TOOLHOST, cli, serve


@contextmanager
def taken_port() -> Iterator[int]:
    """A loopback port some other process listens on for the block."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        yield s.getsockname()[1]


def one_line(proc: subprocess.CompletedProcess[str]) -> str:
    """The command failed with exactly one line on stderr and no traceback."""
    assert proc.returncode != 0, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    line = lines[0]
    assert "Traceback" not in line and "internal error" not in line, line
    assert "ExceptionGroup" not in line, line
    return line


def serve_once(root: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*TOOLHOST, "serve", "--app-root", str(root), "--no-global", *extra],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "XDG_CONFIG_HOME": str(root / ".xdg")},
    )


def test_a_gateway_port_in_use_is_one_line_naming_it(tmp_path):
    root = tmp_path / "app"
    with taken_port() as port:
        write_registry(
            root,
            {"echo": echo(tools=["echo.say"])},
            host={"ws": {"listen": f"127.0.0.1:{port}", "tokenFile": ".toolhost/ws.token"}},
        )
        line = one_line(serve_once(root))
    assert f"127.0.0.1:{port}" in line and "host.ws.listen" in line, line
    assert "in use" in line.lower() and f"ss -ltnp 'sport = :{port}'" in line, line
    # Nothing was left behind: the socket bound first is gone again.
    assert not (root / ".toolhost" / "host.sock").exists()


def test_a_socket_path_taken_or_too_long_is_one_line_naming_it(tmp_path):
    root = tmp_path / "app"
    write_registry(root, {})
    sock = root / ".toolhost" / "host.sock"
    with serve(root):
        line = one_line(serve_once(root))
        assert str(sock) in line and "host.socket" in line and "already serving" in line, line
    long = tmp_path / ("d" * 120) / "host.sock"
    line = one_line(serve_once(root, "--socket", str(long)))
    assert str(long) in line and "--socket" in line and "107" in line, line


def test_an_mcp_http_port_in_use_is_one_line_naming_it(tmp_path):
    root = tmp_path / "app"
    write_registry(root, {})
    with taken_port() as port:
        line = one_line(cli(root, "mcp", "--http", f"127.0.0.1:{port}"))
    assert f"127.0.0.1:{port}" in line and "--http" in line and "in use" in line.lower(), line


def test_the_bench_cold_start_never_binds_the_operators_gateway(tmp_path, monkeypatch):
    """The operator's tools/ has the gateway on a port in use: the cold start does not care."""
    from bench import lifecycle
    from bench.run import Bench, Settings

    repo = tmp_path / "repo"
    with taken_port() as port:
        write_registry(
            repo,
            {"utility": {"command": "python", "args": ["-m", "sidecars.utility"]}},
            host={"ws": {"listen": f"127.0.0.1:{port}", "tokenFile": ".toolhost/ws.token"}},
        )
        monkeypatch.setattr(lifecycle, "REPO", repo, raising=False)
        bench = Bench(Settings.make(quick=True, calls=None), ["cold_start"])
        lifecycle.cold_start(bench)
    names = [f.name for f in bench.results.figures]
    assert "cold start, bundled registry: every sidecar ready" in names, names
    assert json.loads((repo / "tools" / "external.tools.jsonc").read_text())["host"]["ws"]
