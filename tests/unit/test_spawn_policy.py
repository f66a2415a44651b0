"""PROTOCOL 1 ``spawn``: which workers may be forked from the zygote (policy/spawn.py)."""

import pytest

from supervisor.policy.spawn import eligible, startup_env_difference


@pytest.mark.parametrize(
    ("protocol", "mode", "spawn", "command", "args", "expected"),
    [
        ("process-json", "persistent", "auto", "python", ["-m", "sidecars.utility"], True),
        ("process-json", "persistent", "auto", "python3", ["tools/x.py", "--flag"], True),
        ("process-json", "persistent", "exec", "python", ["-m", "sidecars.utility"], False),
        ("process-json", "oneshot", "auto", "python", ["x.py"], False),
        ("simple-json", "persistent", "auto", "python", ["x.py"], False),
        ("mcp", "persistent", "auto", "python", ["-m", "server"], False),
        ("process-json", "persistent", "auto", "node", ["x.js"], False),
        ("process-json", "persistent", "auto", "./python", ["x.py"], False),
        ("process-json", "persistent", "auto", "python", ["-B", "x.py"], False),
        ("process-json", "persistent", "auto", "python", ["-m"], False),
        ("process-json", "persistent", "auto", "python", ["-m", "-X"], False),
        ("process-json", "persistent", "auto", "python", ["-c", "print(1)"], False),
        ("process-json", "persistent", "auto", "python", [], False),
    ],
)
def test_eligible(protocol, mode, spawn, command, args, expected):
    assert eligible(protocol, mode, spawn, command, args) is expected


def test_startup_env_difference():
    base = {"PATH": "/bin", "LANG": "C.UTF-8", "HOME": "/root"}
    assert startup_env_difference({**base, "X": "1", "TZ": "UTC"}, base) is None
    assert startup_env_difference({**base, "LANG": "de_DE.UTF-8"}, base) == "LANG"
    assert startup_env_difference({**base, "LC_ALL": "C"}, base) == "LC_ALL"
    assert startup_env_difference({**base, "PYTHONPATH": "/x"}, base) == "PYTHONPATH"
    assert startup_env_difference({"PATH": "/bin"}, base) == "HOME"
    assert startup_env_difference({**base, "HOMEBREW_X": "1"}, base) is None
