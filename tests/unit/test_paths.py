"""Command resolution per PROTOCOL 1, with the file system injected."""

import pytest

from supervisor.policy.paths import host_path, resolve_command

EXECUTABLES = {"/app/tools/bin/run", "/app/link-inside", "/usr/bin/jq"}
LINKS = {"/app/link-out": "/etc/passwd", "/app/link-inside": "/app/tools/bin/run"}


def which(name, path):
    for folder in path.split(":"):
        cand = f"{folder}/{name}"
        if cand in EXECUTABLES:
            return cand
    return None


def realpath(p):
    return LINKS.get(p, p)


def resolve(command, anchor="app", anchor_dir="/app"):
    return resolve_command(
        command,
        anchor_name=anchor,
        anchor_dir=anchor_dir,
        path_env="/usr/bin:/bin",
        host_python="/venv/bin/python",
        which=which,
        realpath=realpath,
        is_executable=lambda p: realpath(p) in EXECUTABLES or p in EXECUTABLES,
    )


@pytest.mark.parametrize(
    ("command", "state", "mode", "root_safe", "executable"),
    [
        ("./tools/bin/run", "resolved", "relative", True, "/app/tools/bin/run"),
        ("tools/bin/run", "resolved", "relative", True, "/app/tools/bin/run"),
        ("./tools/bin/missing", "unresolved", "relative", True, None),
        ("../outside/run", "outside-root-denied", "relative", False, None),
        ("./tools/../../etc/x", "outside-root-denied", "relative", False, None),
        ("/usr/bin/jq", "outside-root-denied", None, False, None),
        ("~/bin/x", "outside-root-denied", None, False, None),
        ("jq", "resolved", "path", True, "/usr/bin/jq"),
        ("nope-not-installed", "unresolved", "path", True, None),
        ("python", "resolved", "path", True, "/venv/bin/python"),
        ("python3", "resolved", "path", True, "/venv/bin/python"),
        ("./link-out", "outside-root-denied", "relative", False, None),
        ("./link-inside", "resolved", "relative", True, "/app/link-inside"),
        ("", "unresolved", None, False, None),
    ],
)
def test_resolution_table(command, state, mode, root_safe, executable):
    r = resolve(command)
    assert r.state == state, r.message
    assert r.details.mode == mode
    assert r.details.rootSafe is root_safe
    assert r.executable == executable
    if state != "resolved":
        assert r.message
    assert not r.details.base.startswith("/")  # the anchor is named, never a path


def test_absolute_is_not_portable():
    r = resolve("/usr/bin/jq")
    assert r.details.portable is False
    assert "not portable" in r.message


def test_anchor_name_is_reported():
    r = resolve("./tools/bin/run", anchor="workspace")
    assert r.details.base == "workspace"


def test_host_path_puts_the_interpreter_folder_first_without_resolving_symlinks(tmp_path):
    # A venv's python is a symlink to the base interpreter: its own folder is the one wanted.
    base = tmp_path / "base" / "bin"
    base.mkdir(parents=True)
    (base / "python3").touch()
    venv = tmp_path / "venv" / "bin"
    venv.mkdir(parents=True)
    (venv / "python").symlink_to(base / "python3")
    exe = str(venv / "python")
    assert host_path("/usr/bin:/bin", exe) == f"{venv}:/usr/bin:/bin"
    assert host_path(f"/usr/bin:{venv}/:/bin", exe) == f"{venv}:/usr/bin:/bin"
    assert host_path(None, exe).startswith(f"{venv}:")
    assert host_path("", exe) == str(venv)
