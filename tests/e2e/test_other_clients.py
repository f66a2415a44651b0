"""Clients other than Python's: a Node.js script on the Unix socket."""

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import trio

from tests.conftest import echo, write_registry
from tests.e2e.conftest import serve
from tests.e2e.test_serve import wait_visible

NODE = shutil.which("node")
CLIENT = Path(__file__).resolve().parent.parent / "clients" / "node_client.js"


@pytest.mark.skipif(NODE is None and os.environ.get("CI") != "true", reason="node is not installed")
def test_node_client_hello_catalog_invoke(tmp_path):
    assert NODE is not None, "CI must have node"
    root = tmp_path / "app"
    root.mkdir()
    write_registry(root, {"echo": echo(tools=["echo.say"])})
    with serve(root):
        sock = root / ".toolhost" / "host.sock"
        trio.run(wait_visible, sock, ["echo.say"])
        out = subprocess.run(
            [NODE, str(CLIENT), str(sock), "echo.say", json.dumps({"text": "from node"})],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["hello"] == "toolhost/1"
    assert "echo.say" in result["tools"]
    assert result["envelope"]["status"] == "success"
    assert result["envelope"]["data"]["text"] == "from node"
