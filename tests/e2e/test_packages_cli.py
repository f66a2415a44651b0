"""``toolhost pkg`` end to end: against a running ``toolhost serve``, and a host SIGKILLed in the
middle of an apply that the next ``toolhost serve`` recovers."""

import json
import os
import signal
import subprocess

import trio

from tests.conftest import write_registry
from tests.e2e.conftest import TOOLHOST, cli, serve
from tests.e2e.test_serve import wait_visible
from tests.pkgkit import TOOL, assert_no_absolute_paths, build, installed_version


def version_served(root):
    out = cli(root, "invoke", TOOL, "--content")
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout.strip().removeprefix("greet ")


def test_pkg_commands_ask_the_running_host(tmp_path):
    root = tmp_path / "app"
    write_registry(root, {})
    src = tmp_path / "src"
    src.mkdir()
    with serve(root):
        out = cli(root, "pkg", "stage", str(build(src, "1.0.0")))
        assert out.returncode == 0 and "staged greet 1.0.0" in out.stdout, out.stderr
        out = cli(root, "pkg", "apply", "greet")
        assert out.returncode == 0, out.stderr
        assert "applied greet (none) -> 1.0.0: upgrade idle" in out.stdout
        assert version_served(root) == "1.0.0"

        out = cli(root, "pkg", "stage", str(build(src, "1.1.0", archive=True)))
        assert out.returncode == 0, out.stderr
        status = json.loads(cli(root, "pkg", "status", "--json").stdout)
        (pkg,) = status["packages"]
        assert (pkg["installed"], pkg["staged"], pkg["upgrade"]) == ("1.0.0", "1.1.0", "staged")
        assert version_served(root) == "1.0.0"  # staged: the old version keeps serving
        assert cli(root, "pkg", "apply", "greet").returncode == 0
        assert version_served(root) == "1.1.0"

        out = cli(root, "pkg", "rollback", "greet")
        assert out.returncode == 64 and "--yes" in out.stderr
        assert version_served(root) == "1.1.0"
        out = cli(root, "pkg", "rollback", "greet", "--yes")
        assert out.returncode == 0 and "rolled back greet 1.1.0 -> 1.0.0" in out.stdout
        assert version_served(root) == "1.0.0"

        out = cli(root, "pkg", "stage", str(build(src, "2.0.0", toml={"command": "/bin/sh"})))
        assert out.returncode == 1
        assert "invalid-package" in out.stderr and "absolute paths are refused" in out.stderr
        out = cli(root, "pkg", "status")
        assert "greet    1.0.0      idle" in out.stdout, out.stdout
    assert_no_absolute_paths(root)


def test_a_host_killed_mid_apply_is_recovered_by_the_next_start(tmp_path):
    root = tmp_path / "app"
    write_registry(root, {})
    src = tmp_path / "src"
    src.mkdir()
    assert cli(root, "pkg", "stage", str(build(src, "1.0.0"))).returncode == 0
    assert cli(root, "pkg", "apply", "greet").returncode == 0  # no host: applied offline
    assert cli(root, "pkg", "stage", str(build(src, "2.0.0"))).returncode == 0
    hooks = {"TOOLHOST_TEST_HOOKS": "1", "TOOLHOST_PKG_CRASH_AT": "apply:current-moved"}
    sock = root / ".toolhost" / "host.sock"
    with serve(root, env=hooks) as host:
        trio.run(wait_visible, sock, [TOOL])  # 1.0.0 verified at start
        applying = subprocess.Popen(
            [*TOOLHOST, "pkg", "apply", "greet", "--app-root", str(root)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "XDG_CONFIG_HOME": str(root / ".xdg")},
        )
        assert host.stderr is not None
        for line in host.stderr:
            if b"crash point apply:current-moved" in line:
                break
        os.kill(host.pid, signal.SIGKILL)
        host.wait()
        _, err = applying.communicate(timeout=30)
        assert applying.returncode != 0 and "closed the connection" in err
    assert (root / "tools" / "packages" / ".journal.json").exists()
    assert installed_version(root) is None  # 1.0.0 was moved aside when the host died
    with serve(root):
        trio.run(wait_visible, sock, [TOOL])
        assert version_served(root) == "1.0.0"
        status = json.loads(cli(root, "pkg", "status", "--json").stdout)
        assert "undid the interrupted apply of greet (1.0.0 -> 2.0.0)" in status["recovered"][0]
        (pkg,) = status["packages"]
        assert (pkg["installed"], pkg["staged"], pkg["upgrade"]) == ("1.0.0", "2.0.0", "staged")
        assert pkg["problems"] == []
        assert cli(root, "pkg", "apply", "greet").returncode == 0  # and the operator retries
        assert version_served(root) == "2.0.0"
