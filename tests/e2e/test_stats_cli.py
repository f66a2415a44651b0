"""``toolhost stats`` (table, ``--json``, ``--prometheus``) and ``toolhost restart --force``
against a real ``toolhost serve``."""

import json

import trio
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import echo, write_registry
from tests.e2e.conftest import cli, serve
from tests.e2e.test_serve import wait_visible


def test_stats_formats_and_restart(tmp_path):
    root = tmp_path / "app"
    root.mkdir()
    write_registry(root, {"echo": echo(tools=["echo.say"])}, host={"statsIntervalMs": 100})
    with serve(root):
        trio.run(wait_visible, root / ".toolhost" / "host.sock", ["echo.say"])
        for i in range(3):
            r = cli(root, "invoke", "echo.say", json.dumps({"text": f"hi {i}"}))
            assert r.returncode == 0, r.stderr

        r = cli(root, "stats", "--json")
        assert r.returncode == 0, r.stderr
        data = json.loads(r.stdout)
        assert data["tools"]["echo.say"]["calls"] == 3
        assert data["sidecars"]["echo"]["latency"]["count"] == 3

        r = cli(root, "stats")
        assert r.returncode == 0, r.stderr
        head = r.stdout.splitlines()[0].split()
        assert head[:3] == ["SIDECAR", "CALLS", "OK"] and "P99MS" in head and "RSS_MB" in head
        assert any(line.startswith("echo.say ") for line in r.stdout.splitlines())

        r = cli(root, "stats", "--prometheus")
        assert r.returncode == 0, r.stderr
        fams = {f.name: f for f in text_string_to_metric_families(r.stdout)}
        calls = [s for s in fams["toolhost_tool_calls"].samples if s.labels["status"] == "success"]
        assert [(s.labels["sidecar"], s.labels["tool"], s.value) for s in calls] == [
            ("echo", "echo.say", 3.0)
        ]
        assert all(name.startswith("toolhost_") for name in fams)

        r = cli(root, "restart", "echo", "--force")
        assert r.returncode == 0 and "restarted echo" in r.stdout, r.stderr
        r = cli(root, "stats", "--json", "--prometheus")
        assert r.returncode != 0  # one format at a time
